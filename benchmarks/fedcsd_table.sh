#!/usr/bin/env bash
# The FedCSD issue's accuracy table: Fashion-MNIST, Dirichlet(0.1), 10 clients all taking part,
# LeNet-5, 20 rounds x 5 local epochs, seeds 0-2: FedAvg, FedProx, FedLSD, FedNTD, FedGKD, FedCSD
# and the FedCSD ablation rows. 42 runs; about 3.5 hours on 2 cores.
#   bash benchmarks/fedcsd_table.sh [output dir]      (then: driftfl report <output dir>)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-$HOME/driftfl-results/fedcsd-table}
DRIFTFL=.venv/bin/driftfl
SETTING=(partition.alpha=0.1 seed=0,1,2)
$DRIFTFL run -m +experiment=fmnist_label_skew "${SETTING[@]}" \
  strategy=fedavg,fedprox,fedlsd,fedntd,fedgkd,fedcsd hydra.sweep.dir="$OUT/methods"
for row in base m1 m2 m3 forcible; do
  $DRIFTFL run -m "+experiment=[fmnist_label_skew,fedcsd_$row]" "${SETTING[@]}" \
    hydra.sweep.dir="$OUT/fedcsd-$row"
done
$DRIFTFL report "$OUT" --target fedavg --metrics logit_shift,mask_filter_rate,teacher_accuracy
