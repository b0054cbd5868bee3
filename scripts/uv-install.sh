#!/usr/bin/env bash
# Install Python packages with uv into the interpreter $PYTHON names, with pip's own
# configuration there (its indexes, local wheel folders, constraints, CA bundle), exactly as
# `$PYTHON -m pip install ARGS...` would pick them, in a fraction of pip's time: uv downloads
# and unpacks in parallel (driftfl's packages with torch's CUDA wheels: about 30 s against
# 150 s for pip on 2 cores). scripts/setup.sh and docker/Dockerfile use it, and fall back to pip
# when it fails (uv cannot be had, or cannot resolve).
#   PYTHON=.venv/bin/python bash scripts/uv-install.sh torch==2.14.1 -e ".[test]"
set -euo pipefail
PYTHON=${PYTHON:?PYTHON must name the interpreter to install into}

# pip's setting KEY as it applies here: the environment's (PIP_*) before its files'
pip_setting() {
  "$PYTHON" -m pip config list 2>/dev/null \
    | sed -n "s/^\(:env:\|global\|install\)\.$1='\(.*\)'$/\2/p" | head -n 1
}

"$PYTHON" -m pip install --quiet uv
args=()
case " $* " in  # an index given here replaces pip's, as with pip
  *" --index-url "*) ;;
  *) for word in $(pip_setting index-url); do args+=(--index-url "$word"); done ;;
esac
for word in $(pip_setting extra-index-url); do args+=(--extra-index-url "$word"); done
for word in $(pip_setting find-links); do args+=(--find-links "$word"); done
for word in $(pip_setting constraint); do args+=(--constraint "$word"); done
cert=$(pip_setting cert)
if [ -n "$cert" ]; then export SSL_CERT_FILE=$cert; fi
# pip takes the best version across all its indexes, and compiles the modules' bytecode as it
# installs them; uv does each only when told (without the bytecode, and where
# PYTHONDONTWRITEBYTECODE is set, every process compiles every module it imports, each time)
exec "$PYTHON" -m uv pip install --python "$PYTHON" --index-strategy unsafe-best-match \
  --compile-bytecode "${args[@]}" "$@"
