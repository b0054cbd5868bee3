#!/usr/bin/env bash
# One table of every method (docs/results.md, "Every method"): the fmnist_label_skew setting
# (LeNet-5, 10 clients all taking part, 20 rounds x 5 local epochs), pathological #C=2 over
# seeds 0-2 and Dirichlet(0.1) over seed 0. 18 rows x 4 runs = 72 runs of 3-7.5 minutes (5 on
# average on 2 cores): about 6 hours, in the order seed 0 of #C=2, seed 0 of Dirichlet(0.1),
# seeds 1-2 of #C=2.
#
# Each finished run's small files (config.yaml, meta.json with its commit, metrics.json,
# metrics.csv, summary.json) are kept in the repository under
# results/all-methods/<partition>/<label>/seed<k>, and a run kept there is not run again:
# the table can be stopped, committed and finished later, on another machine. Whole run
# directories (model.pt, checkpoint.pt, plots) go to the output dir.
#   bash benchmarks/all_methods_table.sh [output dir]
#   driftfl report results/all-methods --by partition.name,label --target fedavg
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-$HOME/driftfl-results/all-methods}
KEEP=results/all-methods
DRIFTFL=.venv/bin/driftfl
METHODS="fedavg fedprox fedavgm fednova feddisco scaffold feddyn moon fedproto fedcurv fedlsd
         fedntd fedgkd fedcsd fedcsd-code fedssd fedcad dcfl"
run() {  # <partition dir> <seed> <label>
  local part=$1 seed=$2 label=$3
  local dir="$OUT/$part/$label/seed$seed" kept="$KEEP/$part/$label/seed$seed"
  [[ -f $kept/summary.json ]] && return
  # the kept runs' assignment: random leaves class 1 to no client at seed 0 and class 3 at
  # seed 2 (docs/results.md); without it a run gets the default, covering, and every class
  local skew="partition=pathological partition.assignment=random"
  local experiment="+experiment=fmnist_label_skew strategy=$label"
  [[ $part == dirichlet ]] && skew=partition.alpha=0.1
  [[ $label == fedcsd-code ]] && experiment="+experiment=[fmnist_label_skew,fedcsd_code]"
  # shellcheck disable=SC2086  # the skew's and the experiment's overrides are words
  $DRIFTFL run $skew seed="$seed" label="$label" $experiment hydra.run.dir="$dir"
  mkdir -p "$kept"
  cp "$dir"/{config.yaml,meta.json,metrics.json,metrics.csv,summary.json} "$kept"/
}
for part_seed in "pathological 0" "dirichlet 0" "pathological 1" "pathological 2"; do
  read -r part seed <<<"$part_seed"
  for method in $METHODS; do
    run "$part" "$seed" "$method"
  done
done
$DRIFTFL report "$KEEP" --by partition.name,label --target fedavg --out "$OUT"
