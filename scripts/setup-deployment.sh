#!/usr/bin/env bash
# What a deployment needs beyond scripts/setup.sh, on a Debian/Ubuntu machine, idempotently:
#   - nginx, the fleet proxy's server (driftfl secure proxy)
# With --containers, also what the docker-compose demo's tests run it with where no Docker
# engine is (podman, as these machines have it; see README, Deployment):
#   - podman, runc, podman-compose, docker-compose (to validate compose files), debootstrap,
#     netavark and aardvark-dns (containers find each other by service name, also on internal
#     networks), iptables (netavark cannot start a container on a network without it)
#   - $CONTAINERS_CONF (default ~/.cache/driftfl/containers.conf): runc, netavark, and the
#     ulimits a container may set here
#   - localhost/debian:bookworm, a minimal Debian image made offline with debootstrap from the
#     mirror apt uses (no registry is reachable), the demo's base image in tests
set -euo pipefail

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else echo "setup-deployment: need root to run: $*" >&2; exit 1
  fi
}

# One at a time: two test workers may set up at once, and apt holds its locks (the second
# waits here, then finds its packages installed).
exec 9>"${TMPDIR:-/tmp}/driftfl-setup-deployment.lock"
flock 9

apt_install() {  # install the Debian packages that are missing
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return
  echo "setup-deployment: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

apt_install nginx-light
[ "${1:-}" = "--containers" ] || exit 0

apt_install podman runc podman-compose docker-compose debootstrap netavark aardvark-dns iptables
export CONTAINERS_CONF=${CONTAINERS_CONF:-$HOME/.cache/driftfl/containers.conf}
if [ ! -f "$CONTAINERS_CONF" ]; then
  mkdir -p "$(dirname "$CONTAINERS_CONF")"
  cat > "$CONTAINERS_CONF" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=1000:1000"]
[engine]
runtime = "runc"
[network]
network_backend = "netavark"
EOF
fi

BASE=localhost/debian:bookworm
if ! podman image exists "$BASE"; then
  # the mirror apt already uses (deb822 URIs or a one-line source), else Debian's own
  mirror=$(grep -rhoE '^(URIs:[[:space:]]*|deb[[:space:]]+)https?://[^[:space:]]+/debian/?([[:space:]]|$)' \
             /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
           | grep -oE 'https?://[^[:space:]]+' | head -n 1 || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  rootfs=$(mktemp -d)
  echo "setup-deployment: making $BASE with debootstrap from $mirror (about a minute)"
  as_root debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/dev/null
  as_root tar -C "$rootfs" -c . | podman import - "$BASE" >/dev/null
  as_root rm -rf "$rootfs"
fi
echo "setup-deployment: ready (CONTAINERS_CONF=$CONTAINERS_CONF, base image $BASE)"
