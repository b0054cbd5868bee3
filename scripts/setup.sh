#!/usr/bin/env bash
# Set up everything driftfl needs on a Debian/Ubuntu machine, idempotently:
#   - the Fashion-MNIST Debian package (the embedded default dataset), when missing
#   - a virtual environment in .venv with PyTorch, Flower, Hydra and driftfl (editable)
# Re-running it is fast: the Python part is skipped while pyproject.toml and this script are
# unchanged. Environment: PYTHON (interpreter, default python3), DRIFTFL_TORCH (the torch pins).
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else echo "setup: need root to run: $*" >&2; exit 1
  fi
}

FMNIST=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
if [ ! -f "$FMNIST" ]; then
  echo "setup: Fashion-MNIST is missing; installing the Debian package dataset-fashion-mnist"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  if ! "$PYTHON" -m venv .venv 2>/dev/null; then
    echo "setup: python venv support is missing; installing python3-venv"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    rm -rf .venv && "$PYTHON" -m venv .venv
  fi
fi

# torch/torchvision pinned for reproducibility (pyproject.toml only asks for a minimum).
TORCH=${DRIFTFL_TORCH:-"torch==2.14.1 torchvision==0.29.1"}
STAMP=.venv/.driftfl-setup
WANT="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16) $TORCH"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "setup: installing Python packages into .venv (a minute or two the first time)"
  LOG=.venv/setup.log
  # uv (scripts/uv-install.sh: pip's own configuration, in a fraction of pip's time), else pip
  # shellcheck disable=SC2086
  if ! { PYTHON=.venv/bin/python bash scripts/uv-install.sh $TORCH -e ".[test]" \
         || { echo "setup: uv did not install the packages; pip does" \
              && .venv/bin/python -m pip install --upgrade pip \
              && .venv/bin/python -m pip install $TORCH -e ".[test]"; }; } >"$LOG" 2>&1; then
    tail -n 30 "$LOG" >&2
    echo "setup: installing the Python packages failed; the full log is $LOG" >&2
    exit 1
  fi
  echo "$WANT" > "$STAMP"
fi
echo "setup: ready (.venv/bin/driftfl)"
