#!/usr/bin/env bash
# One table of every method (docs/results.md, "Every method"): the fmnist_label_skew setting
# (LeNet-5, 10 clients all taking part, 20 rounds x 5 local epochs), pathological #C=2 over
# seeds 0-2 and Dirichlet(0.1) over seed 0. 18 rows x 4 runs = 72 runs of 4.5-7 minutes: about
# 7 hours on 2 cores. Runs already in the output directory (a summary.json) are kept, so the
# script can be stopped and started again; pass earlier tables' directories to `driftfl report`
# alongside where their runs are reused.
#   bash benchmarks/all_methods_table.sh [output dir]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-$HOME/driftfl-results/all-methods}
DRIFTFL=.venv/bin/driftfl
METHODS="fedavg fedprox fedavgm fednova feddisco scaffold feddyn moon fedproto fedcurv fedlsd
         fedntd fedgkd fedcsd fedssd fedcad dcfl"
run() {  # <partition dir> <seed> <label> <overrides...>
  local dir="$OUT/$1/$3/seed$2" part=$1 seed=$2 label=$3
  shift 3
  [[ -f $dir/summary.json ]] && return
  local skew=partition=pathological
  [[ $part == dirichlet ]] && skew=partition.alpha=0.1
  $DRIFTFL run "$skew" seed="$seed" label="$label" "$@" hydra.run.dir="$dir"
}
for part_seed in "pathological 0" "dirichlet 0" "pathological 1" "pathological 2"; do
  read -r part seed <<<"$part_seed"
  for method in $METHODS; do
    run "$part" "$seed" "$method" +experiment=fmnist_label_skew strategy="$method"
  done
  run "$part" "$seed" fedcsd-code "+experiment=[fmnist_label_skew,fedcsd_code]"
done
$DRIFTFL report "$OUT" --by partition.name,label --target fedavg --out "$OUT"
