"""How far FedNova's global step reaches beyond FedAvg's in a finished run's setting.

FedNova moves the global model by sum_k gamma_k (tau_eff / a_k) (w_G - w_k), tau_eff =
sum_k gamma_k a_k: each client's update is scaled by tau_eff / a_k. FedAvg's weights gamma_k
sum to 1; FedNova's sum to S = sum_k gamma_k tau_eff / a_k, which is 1 only when every a_k is
equal. With gamma_k = n_k / n and a_k growing with n_k (tau_k = E_k ceil(n_k / B)), unequal
clients make S > 1: the global step is S times longer than an average of the client updates.

Recomputed from each run's config.yaml (its partition, held-out split and drawn epochs), no
training; prints S per round (median, min, max) and S with every client at `local_epochs`.

    .venv/bin/python benchmarks/fednova_step_scale.py results/fednova-setting/fednova/seed*
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from driftfl.common.client_split import held_out_count
from driftfl.common.conditions import HeterogeneitySettings, assignments
from driftfl.common.datasets import load_dataset
from driftfl.common.partition import partition
from driftfl.common.sgd import nova_normaliser


def step_scale(sizes: np.ndarray, epochs: list[int], batch: int, momentum: float) -> float:
    """S = sum_k gamma_k tau_eff / a_k for clients of ``sizes`` training ``epochs``."""
    gamma = sizes / sizes.sum()
    a = np.array([nova_normaliser(e * math.ceil(n / batch), momentum)
                  for n, e in zip(sizes, epochs)])
    return float((gamma * (gamma @ a) / a).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (with config.yaml)")
    args = parser.parse_args()
    print("| run | clients' train sizes (min, max) | S per round: median (min, max) | "
          "S at equal epochs |")
    print("|---|---|---|---|")
    for run in args.runs:
        cfg = OmegaConf.load(run / "config.yaml")
        labels = load_dataset(OmegaConf.to_container(cfg.dataset)).train_y
        parts = partition(labels, OmegaConf.to_container(cfg.partition), cfg.num_clients,
                          cfg.seed)  # no aux set: FedNova and FedAvg keep none
        sizes = np.array([len(p) - (held_out_count(len(p), cfg.client_test_fraction)
                                    if cfg.client_test_fraction > 0 else 0) for p in parts],
                         dtype=float)
        heterogeneity = HeterogeneitySettings(**OmegaConf.to_container(cfg.heterogeneity))
        clients = list(range(cfg.num_clients))
        per_round = []
        for server_round in range(1, cfg.rounds + 1):
            drawn = assignments(heterogeneity, cfg.seed, server_round, clients, cfg.local_epochs)
            per_round.append(step_scale(sizes, [drawn[k].epochs for k in clients],
                                        cfg.batch_size, cfg.momentum))
        equal = step_scale(sizes, [cfg.local_epochs] * len(clients), cfg.batch_size,
                           cfg.momentum)
        print(f"| {run} | {sizes.min():.0f}, {sizes.max():.0f} | "
              f"{statistics.median(per_round):.2f} ({min(per_round):.2f}, "
              f"{max(per_round):.2f}) | {equal:.2f} |")


if __name__ == "__main__":
    main()
