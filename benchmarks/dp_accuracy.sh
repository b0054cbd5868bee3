#!/usr/bin/env bash
# shellcheck disable=SC2016  # the jobs' script (in single quotes) expands its own variables
# Accuracy against epsilon (docs/results.md, "Differential privacy: accuracy against epsilon"):
# FedAvg, FedProx and FedNTD without DP and with privacy=central at noise multipliers 0.5, 1
# and 2, on Fashion-MNIST Dir(0.5) with 100 clients, 20 per round (sampling rate 0.2), LeNet-5,
# 30 rounds, seeds 0-2: 36 runs of about 3 minutes alone (6 with two at a time on 2 cores).
# Then the methods whose payload DP covers beside the update (SCAFFOLD's control deltas, the
# prototypes of FedProto with prototype_mean=plain and of FedCSD with prototypes=previous,
# FedCurv's Fisher terms; their default privacy.payload_clip), without DP and at noise
# multipliers 1 and 1.41 (two Gaussian releases a round: 1.41 spends the epsilon one release
# spends at 1), and FedAvg at 1.41 to compare with: 39 runs more. Then FedAvg under
# privacy=distributed with SecAgg+ (each client noises its share, any 16 of the 20 make the
# noise; no amplification is credited: the server knows the sample) at noise multipliers 1 and
# 2: 6 runs more.
#
# Each finished run's small files (config.yaml, meta.json, metrics.json, metrics.csv,
# summary.json) are kept under results/dp-accuracy/<method>_<noise>/seed<k>; a run kept
# there is not run again. Whole run directories go to the output dir.
#   bash benchmarks/dp_accuracy.sh [output dir] [jobs at a time, default 2]
#   .venv/bin/python benchmarks/dp_table.py results/dp-accuracy
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-$HOME/driftfl-results/dp-accuracy}
JOBS=${2:-2}
export OUT KEEP=results/dp-accuracy FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
{
  for seed in 0 1 2; do for method in fedavg fedprox fedntd; do for noise in none 0.5 1.0 2.0; do
    echo "$method $noise $seed"
  done; done; done
  for seed in 0 1 2; do for method in scaffold fedproto-plain fedcsd-previous fedcurv; do
    for noise in none 1.0 1.41; do echo "$method $noise $seed"; done
  done; echo "fedavg 1.41 $seed"; done
  for seed in 0 1 2; do for noise in 1.0 2.0; do echo "fedavg-distributed $noise $seed"; done; done
} | xargs -P "$JOBS" -L 1 bash -c '
  method=$0 noise=$1 seed=$2
  dir=$OUT/${method}_$noise/seed$seed kept=$KEEP/${method}_$noise/seed$seed
  [[ -f $kept/summary.json ]] && exit 0
  mode=central
  case $method in  # the setting each method can be protected in
    fedproto-plain) strategy="strategy=fedproto strategy.prototype_mean=plain" ;;
    fedcsd-previous) strategy="strategy=fedcsd strategy.prototypes=previous" ;;
    fedavg-distributed) strategy="strategy=fedavg secagg=secaggplus" mode=distributed ;;
    *) strategy="strategy=$method" ;;
  esac
  private=""
  [[ $noise != none ]] && private="privacy=$mode privacy.noise_multiplier=$noise"
  mkdir -p "$(dirname "$dir")"
  # shellcheck disable=SC2086  # the strategy and privacy overrides are words
  .venv/bin/driftfl run $strategy $private model=lenet5 num_clients=100 fraction=0.2 \
      partition.alpha=0.5 rounds=30 seed=$seed hydra.run.dir="$dir" > "$dir.log" 2>&1 || true
  mkdir -p "$kept"
  for f in config.yaml meta.json metrics.json metrics.csv summary.json; do
    [[ -f $dir/$f ]] && cp "$dir/$f" "$kept/"
  done'
