#!/usr/bin/env bash
# DCFL's bound on Table II's setting (20 clients, 5 a round, the MLP, 100 rounds): FedAvg,
# DCFL and DCFL shipping random real images (strategy.condensation=real), on #C=2 and Dir(0.1),
# seeds 0-2, one `driftfl run` each, skipping a run already completed.
#   bash benchmarks/dcfl_bound.sh OUT [EXTRA_LABEL:OVERRIDES ...]
# OUT/<condition>/<label>/seed<k> holds each run; a file OUT/PAUSE makes it wait between runs.
# Each extra arm is label:overrides (space-separated), e.g. "dcfl-ft005:strategy=dcfl
# strategy.finetune_lr=0.005". CONDITIONS (default "c2 dir01") picks the partitions.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "$1"); shift
declare -A PARTITION=([c2]="partition=pathological" [dir01]="partition.alpha=0.1"
                      [dir05]="partition.alpha=0.5")
ARMS=("fedavg:strategy=fedavg" "dcfl:strategy=dcfl"
      "dcfl-real:strategy=dcfl strategy.condensation=real" "$@")
for seed in ${SEEDS:-0 1 2}; do
  for condition in ${CONDITIONS:-c2 dir01}; do
    for arm in "${ARMS[@]}"; do
      label=${arm%%:*}; overrides=${arm#*:}
      dir=$OUT/$condition/$label/seed$seed
      if grep -q '"status": "completed"' "$dir/summary.json" 2>/dev/null; then continue; fi
      while [ -e "$OUT/PAUSE" ]; do sleep 10; done
      rm -rf "$dir"; mkdir -p "$(dirname "$dir")"
      echo "$(date +%T) $condition $label seed $seed"
      # shellcheck disable=SC2086
      .venv/bin/driftfl run +experiment=dcfl_fmnist $overrides ${PARTITION[$condition]} \
        seed="$seed" label="$label" hydra.run.dir="$dir" > "$dir.log" 2>&1 \
        || echo "  failed: see $dir.log"
    done
  done
done
