#!/usr/bin/env bash
# driftfl-demo ROLE: what each service of docker/compose.yml runs (one image, several roles).
#   setup      once: credentials and each owner's share of Fashion-MNIST, into the volumes
#   superlink  the SuperLink: TLS, node authentication, state on a volume; only the private
#              network reaches it
#   proxy      the fleet proxy: the nodes' only door, passing the Fleet API alone
#   operator   registers the node keys, then waits for `train`
#   supernode  a data owner's node: its own key and data (the /node volume), nothing else
#   train [overrides]
#              (in the operator: docker compose exec operator driftfl-demo train ...) one run
#              across the nodes (driftfl run superlink=demo); its run directory lands in the
#              host's docker/runs
set -euo pipefail

NODES=${DEMO_NODES:-3}
say() { echo "driftfl-demo $*" >&2; }

wait_for() {  # wait until every named file exists (the setup service writes them)
  for file in "$@"; do
    until [ -s "$file" ]; do sleep 1; done
  done
}

put() {  # copy $1 to $2 whole: a reader never sees half a file
  cp "$1" "$2.part" && mv "$2.part" "$2"
}

setup() {
  if [ -s /secrets/superlink/superlink.key ]; then
    say "setup: the volumes hold credentials and data already; keeping them"
    return
  fi
  local work
  work=$(mktemp -d)
  driftfl secure init "$work/secure" --name superlink --name proxy --nodes "$NODES"
  # shellcheck disable=SC2086  # the split's overrides are words
  driftfl split "$work/owners" num_clients="$NODES" ${DEMO_SPLIT:-partition.alpha=0.5 seed=0}
  for i in $(seq 0 $((NODES - 1))); do
    put "$work/owners/client-$i.npz" "/nodes/$i/data.npz"
    put "$work/secure/ca.crt" "/nodes/$i/ca.crt"
    put "$work/secure/node-$i.key" "/nodes/$i/node.key"
    put "$work/secure/node-$i.key.pub" "/secrets/operator/node-$i.key.pub"
  done
  put "$work/secure/ca.crt" /secrets/operator/ca.crt
  put "$work/secure/ca.crt" /secrets/superlink/ca.crt
  put "$work/secure/superlink.crt" /secrets/superlink/superlink.crt
  put "$work/secure/superlink.key" /secrets/superlink/superlink.key  # last: "ready"
  rm -rf "$work"  # ca.key goes with it: nothing more is signed in the demo
  say "setup: credentials and $NODES owners' data written"
}

superlink() {
  wait_for /secrets/ca.crt /secrets/superlink.crt /secrets/superlink.key
  exec flower-superlink --host 0.0.0.0 --port 9091 --database /state/superlink.db \
    --ssl-ca-certfile /secrets/ca.crt --ssl-certfile /secrets/superlink.crt \
    --ssl-keyfile /secrets/superlink.key --enable-supernode-auth \
    --disable-runtime-dependency-installation
}

proxy() {
  wait_for /secrets/ca.crt /secrets/superlink.crt /secrets/superlink.key
  until getent hosts superlink >/dev/null; do sleep 1; done  # nginx resolves it once, at start
  exec driftfl secure proxy /secrets --listen 0.0.0.0:9090 --superlink superlink:9091
}

operator() {
  wait_for /secrets/ca.crt /secrets/node-$((NODES - 1)).key.pub
  mkdir -p "${FLWR_HOME:-$HOME/.flwr}"
  cat > "${FLWR_HOME:-$HOME/.flwr}/config.toml" <<'EOF'
[superlink.demo]
address = "superlink:9091"
root-certificates = "/secrets/ca.crt"
EOF
  local tries=0
  until driftfl secure register demo /secrets/node-*.key.pub \
      --owners "${FLWR_HOME:-$HOME/.flwr}/owners.json"; do
    tries=$((tries + 1))
    [ "$tries" -lt 60 ] || { say "operator: could not register the nodes"; exit 1; }
    sleep 2
  done
  say "operator: nodes registered; train with: docker compose -f docker/compose.yml exec operator driftfl-demo train [overrides]"
  trap 'exit 0' TERM INT
  sleep infinity & wait
}

supernode() {
  wait_for /node/ca.crt /node/node.key /node/data.npz
  local child
  trap 'kill -TERM "${child:-}" 2>/dev/null; wait; exit 0' TERM INT
  # until the operator has registered this node's key the SuperLink refuses it: try again
  while :; do
    flower-supernode --superlink proxy:9090 --root-certificates /node/ca.crt \
      --auth-supernode-private-key /node/node.key \
      --node-config "data-dir='/node/data.npz' ${DEMO_NODE_CONFIG:-}" &
    child=$!
    wait "$child" && exit 0
    say "supernode: not admitted (yet: is its key registered?); trying again in 10 s"
    sleep 10
  done
}

train() {  # [overrides] [resume=/runs/<name>]: a run across the nodes, or go on with one
  local args=("$@")
  if ! printf '%s\n' "$@" | grep -q '^resume='; then
    args+=("hydra.run.dir=/runs/$(date +%Y-%m-%d_%H-%M-%S)")
  fi
  # driftfl run on the federation: it exits non-zero, saying how to go on, if the run stops
  exec driftfl run superlink=demo num_clients="$NODES" "${args[@]}"
}

role=${1:-}
case "$role" in
  setup|superlink|proxy|operator|supernode|train) shift; "$role" "$@" ;;
  *) exec "$@" ;;
esac
