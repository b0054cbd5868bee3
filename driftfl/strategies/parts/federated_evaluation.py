"""Federated evaluation, a part of every strategy (``DriftStrategy.evaluation``): Flower's
sampling among the surveyed nodes of the round, and the example-weighted mean of the evaluation
replies that pass the checks."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import numpy as np
from flwr.app import Message, MetricRecord

from driftfl.common.error_replies import error_reason, log_refused
from driftfl.common.protocol import METRICS, NUM_EXAMPLES

from driftfl.strategies.parts.aggregation import read_metrics
from driftfl.strategies.parts.clients import KnownClients


class FederatedEvaluation:
    """``fraction``: the share of the round's nodes asked (0: none), at least ``min_nodes``;
    ``clients`` names and bounds the replies, ``weight_cap`` caps each one's weight."""

    def __init__(self, *, fraction: float, min_nodes: int, clients: KnownClients,
                 weight_cap: Callable[[], float]) -> None:
        self.fraction, self.min_nodes = fraction, min_nodes
        self.clients, self.weight_cap = clients, weight_cap

    def sample(self, nodes: list[int]) -> list[int]:
        """Flower's sampling for federated evaluation among ``nodes``."""
        if self.fraction == 0.0:
            return []
        count = max(int(len(nodes) * self.fraction), self.min_nodes)
        return random.sample(nodes, min(count, len(nodes)))

    def aggregate(self, replies: Iterable[Message]) -> MetricRecord | None:
        """The example-weighted mean of the evaluation replies that pass the checks."""
        usable: list[tuple[float, dict]] = []
        refused = []
        for msg in self.clients.in_order(replies):
            checked = self.check(msg)
            if isinstance(checked, str):
                refused.append((self.clients.describe(msg.metadata.src_node_id), checked))
            else:
                usable.append(checked)
        log_refused("evaluation", refused)
        if not usable:
            return None
        weights = np.array([n for n, _ in usable]) / sum(n for n, _ in usable)
        shared = set.intersection(*(set(m) for _, m in usable))
        return MetricRecord({key: float(sum(w * m[key] for w, (_, m) in zip(weights, usable)))
                             for key in sorted(shared)})

    def check(self, msg: Message) -> tuple[float, dict[str, float]] | str:
        """(num-examples, scalar metrics) of an evaluation reply, or why it cannot be used."""
        if msg.has_error():
            return error_reason(msg.error)
        if METRICS not in msg.content.metric_records:
            return f"reply lacks the '{METRICS}' record"
        metrics = read_metrics(msg.content.metric_records[METRICS])
        if isinstance(metrics, str):
            return metrics
        n = metrics.pop(NUM_EXAMPLES, None)
        surveyed = self.clients.count(msg.metadata.src_node_id)
        if not isinstance(n, float) or not 0 < n <= surveyed:
            return f"'{NUM_EXAMPLES}' is {n}; expected 1..{surveyed} (the data survey's count)"
        return min(n, self.weight_cap()), {k: v for k, v in metrics.items()
                                           if isinstance(v, float)}
