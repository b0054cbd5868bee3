"""Checking and averaging client replies, and the ``aggregation`` part of a strategy: how the
replies that passed every check become the next global model. Nothing here trusts a client."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from flwr.app import Array, ArrayRecord, Message
from torch import nn

from driftfl.common import settings
from driftfl.common.columns import MAX_METRIC, metric_name_problem
from driftfl.common.config import ExperimentConfig
from driftfl.common.error_replies import error_reason
from driftfl.common.protocol import ARRAYS, LOCAL_STEPS, METRICS, NUM_EXAMPLES, PER_CLASS_METRICS
from driftfl.specs import PartSpec
from driftfl.specs import parts as declared
from driftfl.strategies.registry import written_columns


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


def check_reply(msg: Message, reference: dict[str, np.ndarray],
                max_update: float = math.inf) -> ClientUpdate | str:
    """A ClientUpdate, or the reason this reply must not touch the global model: its model has
    the global model's keys, shapes and dtypes, finite values and an update ||w_k - w|| of at
    most ``max_update`` (``norm_bound``, computed once per round); its metrics are finite; it
    trained on a positive number of examples in at least one local step."""
    if msg.has_error():
        return error_reason(msg.error)
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
    update = update_norm(arrays, reference)
    if not update <= max_update:
        return (f"its update's norm {update:.3g} exceeds the bound {max_update:.3g} "
                "(max_update_ratio)")
    metrics = read_metrics(content.metric_records[METRICS])
    if isinstance(metrics, str):
        return metrics
    n = metrics.get(NUM_EXAMPLES)
    if not isinstance(n, float) or n <= 0:
        return f"'{NUM_EXAMPLES}' is missing or not a positive number"
    steps = metrics.get(LOCAL_STEPS)
    if not isinstance(steps, float) or steps < 1:
        return f"'{LOCAL_STEPS}' is {steps}; a reply must report at least one local step"
    return ClientUpdate(msg.metadata.src_node_id, arrays, metrics, msg)


def read_metrics(record) -> dict[str, float | list[float]] | str:
    """A reply's metrics as floats and lists of floats, or why they cannot be used: a metric's
    name must be plain and name no column the server or any strategy writes
    (``columns.metric_name_problem``); a per-class metric (``PER_CLASS_METRICS``) is a list
    that may hold NaN for a class the client lacks, not an infinity; every other metric is one
    finite number (not a bool, a string or a list); no value is over ``MAX_METRIC`` in
    magnitude."""
    metrics: dict[str, float | list[float]] = {}
    written = written_columns()
    for key, value in record.items():
        if problem := metric_name_problem(key, written):
            return problem
        if key in PER_CLASS_METRICS:
            if not isinstance(value, list) or not all(_is_number(v) for v in value):
                return f"metric '{key}' is {_kind(value)}; expected a list of numbers"
            values = [float(v) for v in value]
            if any(math.isinf(v) for v in values):
                return f"metric '{key}' holds an infinite value"
            if any(abs(v) > MAX_METRIC for v in values):
                return f"metric '{key}' holds a value over {MAX_METRIC:.0e} in magnitude"
            metrics[key] = values
        elif _is_number(value):
            if not math.isfinite(value):
                return f"metric '{key}' is {value}"
            if abs(value) > MAX_METRIC:
                return f"metric '{key}' is {value:.3g}, over {MAX_METRIC:.0e} in magnitude"
            metrics[key] = float(value)
        else:
            return f"metric '{key}' is {_kind(value)}; expected a number"
    return metrics


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value) -> str:
    return "a list" if isinstance(value, list) else f"of type {type(value).__name__}"


def model_norm(arrays: dict[str, np.ndarray]) -> float:
    """The L2 norm over every floating array of a model (parameters and buffers)."""
    return math.sqrt(sum(float(np.sum(np.square(v, dtype=np.float64)))
                         for v in arrays.values() if v.dtype.kind == "f"))


def update_norm(arrays: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    """||arrays - reference||_2 over the floating arrays, one array's difference at a time."""
    return math.sqrt(sum(float(np.sum(np.square(v.astype(np.float64) - reference[k])))
                         for k, v in arrays.items() if v.dtype.kind == "f"))


def norm_bound(reference: dict[str, np.ndarray], max_update_ratio: float) -> float:
    """How far a reply (or the aggregate) may move from the global model: ``max_update_ratio``
    times its norm, at least ``max_update_ratio`` (a model near zero may still learn)."""
    return max_update_ratio * max(1.0, model_norm(reference))


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


def apply_update(global_arrays: dict[str, np.ndarray],
                 update: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The global model moved by ``update``, one array per floating array in the model's
    order (a protected release's mean update); integer arrays (counters) stay as they are."""
    keys = [k for k, v in global_arrays.items() if v.dtype.kind == "f"]
    out = dict(global_arrays)
    for key, delta in zip(keys, update, strict=True):
        out[key] = (global_arrays[key] + delta).astype(global_arrays[key].dtype)
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

    # what the rule declares (driftfl.specs.parts, checked before torch loads): the
    # ``aggregation`` section's settings, and ``individual`` below
    spec: ClassVar[PartSpec] = declared.AGGREGATIONS["mean"]
    Settings: ClassVar[type[settings.Settings]] = settings.NoSettings
    # robust rules apply themselves to a method's extra payloads too (``combine``); a method
    # keeps its paper's own formula for those under a plain rule
    robust: ClassVar[bool] = False
    # what the rule needs of each client's own update ("": nothing): DP's noise is calibrated
    # to the plain sum, and secure aggregation shows only the sum (driftfl.rules refuses both)
    individual: ClassVar[str] = ""
    # the rule bounds each reply's model before anything uses it (``bound_updates``): a
    # method's state made of the replies' models is then bounded with them
    bounds_updates: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "spec" in cls.__dict__:
            cls.Settings, cls.individual = cls.spec.Settings, cls.spec.individual

    @classmethod
    def from_config(cls, cfg: ExperimentConfig, model: nn.Module) -> Aggregation:
        return cls()

    def meet(self, clients: list[dict]) -> None:
        """What the data survey found (node_id, partition_id, num_examples, label_histogram
        per client), before the first round; FedDisco keeps the histograms."""

    def rekey(self, moved: dict[int, int]) -> None:
        """State kept by node id follows its client to a new node id (old -> new)."""

    def reject(self, update: ClientUpdate) -> str | None:
        """Why this rule cannot use a reply that passed the common checks (None: it can)."""
        return None

    def refuse(self, updates: list[ClientUpdate]) -> str | None:
        """Why this round's accepted replies together cannot be aggregated (None: they can);
        the round then keeps the global model."""
        return None

    def weights(self, updates: list[ClientUpdate]) -> np.ndarray:
        return example_weights(updates)

    def aggregate(self, updates: list[ClientUpdate],
                  global_arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The next global model from the accepted ``updates`` of the model ``global_arrays``."""
        return weighted_average(updates, self.weights(updates))

    def standalone(self) -> Aggregation:
        """The rule to ``combine`` payloads with where no model aggregate of the round came
        first (FedCSD's prototype phase precedes it): this one, unless its combination follows
        its aggregate's choice (Krum)."""
        return self

    def combine(self, payloads: list[dict[str, np.ndarray]], weights: np.ndarray,
                among: list[int] | None = None) -> dict[str, np.ndarray]:
        """One payload per reply of the last ``aggregate`` (same order: SCAFFOLD's Delta c_k,
        prototypes, ...) made into one, float64: their ``weights``-weighted mean here; a robust
        rule treats them as it treated the models. ``among``: the positions, in those replies,
        of the payloads given (some replies only: the holders of a class); {} when the rule
        keeps none of them."""
        return weighted_mean(payloads, weights)

    def bound_updates(self, updates: list[ClientUpdate],
                      global_arrays: dict[str, np.ndarray]) -> list[ClientUpdate]:
        """The round's accepted replies, each model bounded as this rule bounds a client's
        part, before the aggregate and any method state use them: as sent here."""
        return updates

    def bound(self, payloads: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """The round's payloads that a method keeps per client rather than combines
        (FedCurv's Fisher terms), each bounded as this rule bounds a client's part: as sent
        here (bounded.py bounds them where clients are not trusted)."""
        return payloads


def weighted_mean(payloads: list[dict[str, np.ndarray]],
                  weights: np.ndarray) -> dict[str, np.ndarray]:
    """sum_k weight_k * payload_k per key, float64 (weights normalised to sum to 1)."""
    weights = np.asarray(weights, dtype=np.float64) / np.sum(weights)
    return {key: sum(w * p[key].astype(np.float64) for w, p in zip(weights, payloads))
            for key in payloads[0]}
