#!/usr/bin/env bash
# FedNova's own setting (docs/results.md, "Unequal local work: FedNova's setting"): FedAvg,
# FedProx, FedNova and SCAFFOLD with each client's local epochs drawn from {1..5} per client and
# round (heterogeneity=epochs), Dirichlet(0.1), in the fmnist_label_skew setting otherwise
# (LeNet-5, 10 clients all taking part, 20 rounds), seeds 0-2, each client holding out 20 % of
# its data (client_test_fraction=0.2) for per-client accuracy every 5 rounds and after the last.
# 12 runs of about 2-5 minutes on 2 cores (3 epochs a round on average): about an hour.
#
# Each finished run's small files (config.yaml, meta.json, metrics.json, metrics.csv,
# clients.csv, summary.json) are kept under results/fednova-setting/<label>/seed<k>; a run
# kept there is not run again. Whole run directories go to the output dir.
#   bash benchmarks/fednova_table.sh [output dir]
#   driftfl report results/fednova-setting --target fedavg
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-$HOME/driftfl-results/fednova-setting}
KEEP=results/fednova-setting
DRIFTFL=.venv/bin/driftfl
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
for seed in 0 1 2; do
  for method in fedavg fedprox fednova scaffold; do
    dir="$OUT/$method/seed$seed" kept="$KEEP/$method/seed$seed"
    [[ -f $kept/summary.json ]] && continue
    $DRIFTFL run +experiment=fmnist_label_skew strategy="$method" partition.alpha=0.1 \
        heterogeneity=epochs heterogeneity.min_epochs=1 heterogeneity.max_epochs=5 \
        client_test_fraction=0.2 eval_every=5 seed="$seed" label="$method" \
        hydra.run.dir="$dir"
    mkdir -p "$kept"
    cp "$dir"/{config.yaml,meta.json,metrics.json,metrics.csv,clients.csv,summary.json} "$kept"/
  done
done
$DRIFTFL report "$KEEP" --target fedavg --out "$OUT"
