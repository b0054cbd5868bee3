"""FedDisco (Ye et al. 2023): aggregation weights that favour clients whose label distribution
is close to uniform.

  p_k ∝ ReLU(n_k / n - a * d_k + b),  d_k = ||D_k - U||_2  (metric=l2, the default),
D_k the client's label distribution (its surveyed histogram, normalised), U uniform over the
classes, n = sum of the round's n_k. When every p_k is 0 the example weights n_k / n are used.
metric=kl is the authors' scripts' choice (MediaBrain-SJTU/FedDisco, --measure_difference=kl):
d_k = KL(D_k || U) with 0 log 0 = 0 (no smoothing), divided by its sum over the round's
clients (all 0 when that sum is 0), as their ``get_distribution_difference`` does.
The histograms come from the server's data survey, not from a train reply: a client cannot
change its weight by what it reports.
"""

from __future__ import annotations

import numpy as np

from driftfl.specs import parts as declared
from driftfl.strategies.parts.aggregation import Aggregation, ClientUpdate, example_weights


def discrepancy(histogram: np.ndarray, metric: str = "l2") -> float:
    """d_k for a label histogram (counts per class): ||D_k - U||_2, or (kl) KL(D_k || U) before
    the round's normalisation (``round_discrepancies``)."""
    counts = np.asarray(histogram, dtype=np.float64)
    dist = counts / counts.sum()
    if metric == "kl":  # sum_c D_c log(D_c C); an empty class adds 0, as scipy's kl_div
        held = dist > 0
        return float(np.sum(dist[held] * np.log(dist[held] * len(dist))))
    return float(np.linalg.norm(dist - 1.0 / len(dist)))


def round_discrepancies(discrepancies: np.ndarray, metric: str) -> np.ndarray:
    """The d_k the weights use: kl's divided by their sum over the round, as the authors' code
    does (KL is unbounded; this puts d_k in [0, 1]); l2's as they are."""
    d = np.asarray(discrepancies, dtype=np.float64)
    if metric != "kl":
        return d
    return d / d.sum() if d.sum() > 0 else np.zeros_like(d)


def disco_weights(num_examples: np.ndarray, discrepancies: np.ndarray, a: float,
                  b: float) -> np.ndarray:
    """p_k ∝ ReLU(n_k / n - a d_k + b); the example weights when every p_k is 0."""
    n = np.asarray(num_examples, dtype=np.float64)
    raw = np.maximum(n / n.sum() - a * np.asarray(discrepancies) + b, 0.0)
    return raw / raw.sum() if raw.sum() > 0 else n / n.sum()


class FedDiscoAggregation(Aggregation):
    spec = declared.AGGREGATIONS["feddisco"]

    def __init__(self, *, a: float, b: float, metric: str = "l2") -> None:
        self.a, self.b, self.metric = a, b, metric
        # node id -> d_k from the survey (kl: before the round's normalisation)
        self.discrepancies: dict[int, float] = {}

    @classmethod
    def from_config(cls, cfg, model) -> FedDiscoAggregation:
        return cls(a=cfg.aggregation.a, b=cfg.aggregation.b, metric=cfg.aggregation.metric)

    def meet(self, clients: list[dict]) -> None:
        self.discrepancies = {c["node_id"]: discrepancy(c["label_histogram"], self.metric)
                              for c in clients if sum(c["label_histogram"]) > 0}

    def reject(self, update: ClientUpdate) -> str | None:
        if update.node_id not in self.discrepancies:
            return "node was not surveyed: FedDisco has no label histogram for it"
        return None

    def weights(self, updates: list[ClientUpdate]) -> np.ndarray:
        if not updates:
            return example_weights(updates)
        return disco_weights(np.array([u.num_examples for u in updates]),
                             round_discrepancies([self.discrepancies[u.node_id]
                                                  for u in updates], self.metric),
                             self.a, self.b)
