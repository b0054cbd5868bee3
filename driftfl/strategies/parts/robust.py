"""Robust aggregation: rules a few bad replies cannot steer, under any method's local objective.
Each one calls Flower's own implementation rather than writing it again.

- ``median``: coordinate-wise median (Yin et al. 2018; Flower's FedMedian, ``aggregate_median``).
- ``trimmed_mean``: per coordinate, the int(beta n) largest and smallest of the n values are
  dropped and the rest averaged (Yin et al. 2018; Flower's FedTrimmedAvg,
  ``aggregate_trimmed_avg``).
- ``krum``: each reply scored by the summed squared distances to its n - f - 2 nearest others;
  the m lowest-scored are kept and averaged by examples (Blanchard et al. 2017; Flower's Krum and
  MultiKrum, ``select_multikrum``). m = 1 is Krum.

Median and trimmed mean count every reply once, as Flower's do: a client cannot buy weight with
the num-examples it reports, which nothing checks. They act on floating arrays; integer arrays
(BatchNorm's num_batches_tracked) are counters, taken from the first reply as in
``weighted_average``.

Too few replies: a rule that cannot do its job with n replies (Krum: n <= 2f + 2; trimmed mean:
beta > 0 but int(beta n) = 0, which would cut nothing) refuses. When the experiment already gives
too few clients per round, checking the experiment stops with a ConfigError (driftfl's one-line
refusal, before anything runs); when a round gets fewer replies than planned, that round keeps
the global model, and the log and metrics.csv say why.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
from flwr.app import RecordDict
from flwr.server.strategy.aggregate import aggregate_median, aggregate_trimmed_avg
from flwr.serverapp.strategy.multikrum import select_multikrum

from driftfl.common.protocol import ARRAYS
from driftfl.specs import parts as declared
from driftfl.specs.parts import krum_planned, krum_too_few, trimmed_mean_too_few
from driftfl.strategies.parts.aggregation import (
    Aggregation,
    ClientUpdate,
    example_weights,
    to_record,
    weighted_average,
    weighted_mean,
)


def coordinatewise(updates: list[ClientUpdate], rule: Callable) -> dict[str, np.ndarray]:
    """One of Flower's rules on lists of (NDArrays, num_examples) applied to the floating
    arrays; integer arrays from the first reply, as ``weighted_average`` takes them."""
    first = updates[0].arrays
    keys = [key for key, value in first.items() if value.dtype.kind == "f"]
    merged = rule([([u.arrays[key] for key in keys], u.num_examples) for u in updates])
    out = {key: value.copy() for key, value in first.items()}
    out.update({key: np.asarray(m, dtype=first[key].dtype) for key, m in zip(keys, merged)})
    return out


def payload_coordinatewise(payloads: list[dict[str, np.ndarray]],
                           rule: Callable) -> dict[str, np.ndarray]:
    """One of Flower's coordinate-wise rules on one payload per reply, float64 (every reply
    counts once, as for the models)."""
    keys = list(payloads[0])
    merged = rule([([p[key].astype(np.float64) for key in keys], 1) for p in payloads])
    return {key: np.asarray(m, dtype=np.float64) for key, m in zip(keys, merged)}


class RobustAggregation(Aggregation):
    """What the robust rules share: refusing a round with too few replies."""

    name = ""  # as aggregation= names it
    robust = True

    @classmethod
    def from_config(cls, cfg, model) -> RobustAggregation:
        return cls(**cfg.aggregation.model_dump(exclude={"name"}))

    def planned(self, n: int) -> str | None:
        """Why n replies per round cannot be the plan (None: they can)."""
        return self.too_few(n)

    def too_few(self, n: int) -> str | None:
        """Why this rule cannot aggregate n replies (None: it can)."""
        return None

    def refuse(self, updates: list[ClientUpdate]) -> str | None:
        # an unprotected aggregate is what the rule was chosen to prevent: the round keeps
        # the global model (DriftStrategy.aggregate_train logs and records why)
        return self.too_few(len(updates))



class MedianAggregation(RobustAggregation):
    """Coordinate-wise median: with fewer than half the replies bad, every coordinate stays
    within the good replies' range (with 2 replies it is their mean)."""

    name = "median"
    spec = declared.AGGREGATIONS["median"]

    def aggregate(self, updates, global_arrays):
        return coordinatewise(updates, aggregate_median)

    def combine(self, payloads, weights, among=None):
        return payload_coordinatewise(payloads, aggregate_median)


class TrimmedMeanAggregation(RobustAggregation):
    """``beta``: the share of the n replies cut at each end of every coordinate, int(beta n)
    (0: the plain unweighted mean)."""

    name = "trimmed_mean"
    spec = declared.AGGREGATIONS["trimmed_mean"]

    def __init__(self, *, beta: float = 0.2) -> None:
        self.beta = beta

    def too_few(self, n):
        return trimmed_mean_too_few(self.beta, n)

    def aggregate(self, updates, global_arrays):
        return coordinatewise(updates, partial(aggregate_trimmed_avg, proportiontocut=self.beta))

    def combine(self, payloads, weights, among=None):
        return payload_coordinatewise(
            payloads, partial(aggregate_trimmed_avg, proportiontocut=self.beta))


class KrumAggregation(RobustAggregation):
    """``num_malicious`` f: the bad replies to tolerate; ``num_selected`` m: the replies kept
    and averaged (by examples, as Flower's MultiKrum), at most n - f in a round."""

    name = "krum"
    spec = declared.AGGREGATIONS["krum"]

    def __init__(self, *, num_malicious: int = 0, num_selected: int = 1) -> None:
        self.num_malicious = num_malicious
        self.num_selected = num_selected
        self.kept: list[int] = []  # positions of the replies the last aggregate kept

    def planned(self, n):
        return krum_planned(self.num_malicious, self.num_selected, n)

    def too_few(self, n):
        return krum_too_few(self.num_malicious, n)

    def selected(self, updates: list[ClientUpdate],
                 global_arrays: dict[str, np.ndarray]) -> list[int]:
        """Positions (in node order) of the replies Flower's Krum / Multi-Krum keeps."""
        keys = [key for key, value in global_arrays.items() if value.dtype.kind == "f"]
        # distances between updates w_k - w_G in float64: the same as between the models, but
        # without the cancellation of ||x||^2 + ||y||^2 - 2xy on large float32 weights
        contents = [RecordDict({ARRAYS: to_record(
            {key: u.arrays[key].astype(np.float64) - global_arrays[key] for key in keys})})
            for u in updates]
        keep = min(self.num_selected, len(updates) - self.num_malicious)
        chosen = select_multikrum(contents, num_malicious_nodes=self.num_malicious,
                                  num_nodes_to_select=keep)
        position = {id(content): i for i, content in enumerate(contents)}
        return sorted(position[id(content)] for content in chosen)

    def aggregate(self, updates, global_arrays):
        self.kept = self.selected(updates, global_arrays)
        kept = [updates[i] for i in self.kept]
        return weighted_average(kept, example_weights(kept))

    def standalone(self):
        """Krum combines the payloads of the replies its model aggregate kept: before any
        aggregate the coordinate-wise median stands in for it."""
        return MedianAggregation()

    def combine(self, payloads, weights, among=None):
        """The payloads of the replies Krum kept for the model, by their weights."""
        among = range(len(payloads)) if among is None else among
        kept = [i for i, position in enumerate(among) if position in self.kept]
        if not kept:
            return {}
        return weighted_mean([payloads[i] for i in kept],
                             np.asarray(weights, dtype=np.float64)[kept])
