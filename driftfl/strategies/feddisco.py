"""FedDisco (Ye et al. 2023): aggregation weights that favour clients whose label distribution
is close to uniform.

  p_k ∝ ReLU(n_k / n - a * d_k + b),  d_k = ||D_k - U||_2,
D_k the client's label distribution (its surveyed histogram, normalised), U uniform over the
classes, n = sum of the round's n_k. When every p_k is 0 the example weights n_k / n are used.
The histograms come from the server's data survey, not from a train reply: a client cannot
change its weight by what it reports.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from driftfl.common.settings import Settings

from .aggregation import Aggregation, ClientUpdate, example_weights


class FedDiscoSettings(Settings):
    a: float = Field(0.5, ge=0)  # weight of the discrepancy d_k
    b: float = Field(0.1)  # offset added before the ReLU


def discrepancy(histogram: np.ndarray) -> float:
    """d_k = ||D_k - U||_2 for a label histogram (counts per class)."""
    counts = np.asarray(histogram, dtype=np.float64)
    return float(np.linalg.norm(counts / counts.sum() - 1.0 / len(counts)))


def disco_weights(num_examples: np.ndarray, discrepancies: np.ndarray, a: float,
                  b: float) -> np.ndarray:
    """p_k ∝ ReLU(n_k / n - a d_k + b); the example weights when every p_k is 0."""
    n = np.asarray(num_examples, dtype=np.float64)
    raw = np.maximum(n / n.sum() - a * np.asarray(discrepancies) + b, 0.0)
    return raw / raw.sum() if raw.sum() > 0 else n / n.sum()


class FedDiscoAggregation(Aggregation):
    Settings = FedDiscoSettings

    def __init__(self, *, a: float, b: float) -> None:
        self.a, self.b = a, b
        self.discrepancies: dict[int, float] = {}  # node id -> d_k, from the survey

    @classmethod
    def from_config(cls, cfg, model) -> FedDiscoAggregation:
        return cls(a=cfg.aggregation.a, b=cfg.aggregation.b)

    def meet(self, clients: list[dict]) -> None:
        self.discrepancies = {c["node_id"]: discrepancy(c["label_histogram"]) for c in clients
                              if sum(c["label_histogram"]) > 0}

    def reject(self, update: ClientUpdate) -> str | None:
        if update.node_id not in self.discrepancies:
            return "node was not surveyed: FedDisco has no label histogram for it"
        return None

    def weights(self, updates: list[ClientUpdate]) -> np.ndarray:
        if not updates:
            return example_weights(updates)
        return disco_weights(np.array([u.num_examples for u in updates]),
                             np.array([self.discrepancies[u.node_id] for u in updates]),
                             self.a, self.b)
