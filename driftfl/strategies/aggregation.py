"""Checking and averaging client replies, and the ``aggregation`` part of a strategy: how the
replies that passed every check become the next global model. Nothing here trusts a client."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from flwr.app import Array, ArrayRecord, Message
from torch import nn

from driftfl.common.config import ExperimentConfig
from driftfl.common.protocol import ARRAYS, METRICS, NUM_EXAMPLES
from driftfl.common.settings import NoSettings, Settings


@dataclass(frozen=True)
class ClientUpdate:
    """A reply that passed every check: its model as NumPy arrays and its scalar metrics."""

    node_id: int
    arrays: dict[str, np.ndarray]
    metrics: dict[str, float | list[float]]
    message: Message

    @property
    def num_examples(self) -> float:
        return self.metrics[NUM_EXAMPLES]


def check_reply(msg: Message, reference: dict[str, np.ndarray]) -> ClientUpdate | str:
    """A ClientUpdate, or the reason this reply must not touch the global model."""
    if msg.has_error():
        return f"error reply: {msg.error.reason}"
    content = msg.content
    if ARRAYS not in content.array_records or METRICS not in content.metric_records:
        return f"reply lacks the '{ARRAYS}' or '{METRICS}' record"
    record = content.array_records[ARRAYS]
    if set(record.keys()) != set(reference):
        return "model keys differ from the global model's"
    arrays = {}
    for key, ref in reference.items():
        try:
            value = record[key].numpy()
        except Exception as err:  # a corrupt array: unreadable bytes
            return f"array '{key}' cannot be read: {err}"
        if value.shape != ref.shape or value.dtype != ref.dtype:
            return (f"array '{key}' is {value.dtype}{list(value.shape)}, "
                    f"expected {ref.dtype}{list(ref.shape)}")
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return f"array '{key}' holds NaN or infinite values"
        arrays[key] = value
    metrics = {}
    for key, value in content.metric_records[METRICS].items():
        if isinstance(value, list):
            metrics[key] = [float(v) for v in value]
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[key] = float(value)
    n = metrics.get(NUM_EXAMPLES)
    if n is None or not math.isfinite(n) or n <= 0:
        return f"'{NUM_EXAMPLES}' is missing or not a positive number"
    return ClientUpdate(msg.metadata.src_node_id, arrays, metrics, msg)


def example_weights(updates: list[ClientUpdate]) -> np.ndarray:
    """gamma_k = n_k / sum_j n_j."""
    n = np.array([u.num_examples for u in updates], dtype=np.float64)
    return n / n.sum()


def weighted_average(updates: list[ClientUpdate], weights: np.ndarray) -> dict[str, np.ndarray]:
    """Sum_k weight_k * w_k for floating arrays (in float64, cast back); integer arrays such as
    BatchNorm's num_batches_tracked are counters, taken from the first client."""
    first = updates[0].arrays
    out = {}
    for key, value in first.items():
        if value.dtype.kind == "f":
            total = sum(w * u.arrays[key].astype(np.float64) for w, u in zip(weights, updates))
            out[key] = np.asarray(total, dtype=value.dtype)
        else:
            out[key] = value.copy()
    return out


def mean_metrics(updates: list[ClientUpdate], weights: np.ndarray) -> dict:
    """Weighted mean of every metric all replies carry (num-examples is summed). Lists of one
    length (a value per class) are averaged per entry, NaN entries (a class a client lacks)
    left out."""
    shared = set.intersection(*(set(u.metrics) for u in updates)) - {NUM_EXAMPLES}
    out: dict = {}
    for key in sorted(shared):
        values = [u.metrics[key] for u in updates]
        if all(isinstance(v, float) for v in values):
            out[key] = float(np.dot(weights, values))
        elif all(isinstance(v, list) for v in values) and len({len(v) for v in values}) == 1:
            table = np.array(values, dtype=np.float64)
            w = np.where(np.isnan(table), 0.0, weights[:, None])
            sums = (np.nan_to_num(table) * w).sum(axis=0)
            totals = w.sum(axis=0)
            out[key] = np.where(totals > 0, sums / np.maximum(totals, 1e-300), np.nan).tolist()
    out[NUM_EXAMPLES] = float(sum(u.num_examples for u in updates))
    return out


def to_numpy(arrays: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in arrays.items()}


def to_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    # np.ascontiguousarray would turn 0-d arrays (BatchNorm counters) into shape (1,)
    return ArrayRecord({k: Array(np.require(v, requirements="C")) for k, v in arrays.items()})


class Aggregation:
    """FedAvg's example-weighted mean, w = sum_k gamma_k w_k with gamma_k = n_k / sum_j n_j.
    Every other rule refines it: its weights (FedDisco), its update (FedNova), or the whole
    aggregate (robust rules)."""

    Settings: ClassVar[type[Settings]] = NoSettings  # the ``aggregation`` section's settings

    @classmethod
    def from_config(cls, cfg: ExperimentConfig, model: nn.Module) -> Aggregation:
        return cls()

    def meet(self, clients: list[dict]) -> None:
        """What the data survey found (node_id, partition_id, num_examples, label_histogram
        per client), before the first round; FedDisco keeps the histograms."""

    def reject(self, update: ClientUpdate) -> str | None:
        """Why this rule cannot use a reply that passed the common checks (None: it can)."""
        return None

    def weights(self, updates: list[ClientUpdate]) -> np.ndarray:
        return example_weights(updates)

    def aggregate(self, updates: list[ClientUpdate],
                  global_arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The next global model from the accepted ``updates`` of the model ``global_arrays``."""
        return weighted_average(updates, self.weights(updates))
