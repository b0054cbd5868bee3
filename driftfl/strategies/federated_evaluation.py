"""Federated evaluation for every driftfl strategy: Flower's sampling among the surveyed nodes
connected, and the example-weighted mean of the evaluation replies that pass the checks."""

from __future__ import annotations

import random
from collections.abc import Iterable
from logging import WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from driftfl.common.protocol import METRICS, NUM_EXAMPLES

from .aggregation import read_metrics


class FederatedEvaluation:
    """DriftStrategy's evaluate half (it supplies ``available``, ``in_node_order``,
    ``describe``, ``survey_count``, ``weight_cap`` and ``report``)."""

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Flower's sampling for federated evaluation, among the surveyed nodes connected."""
        if self.fraction_evaluate == 0.0:
            return []
        nodes = self.available(server_round, grid)
        count = max(int(len(nodes) * self.fraction_evaluate), self.min_evaluate_nodes)
        config["server-round"] = server_round
        return self._construct_messages(
            RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config}),
            random.sample(nodes, min(count, len(nodes))), MessageType.EVALUATE)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """The example-weighted mean of the evaluation replies that pass the checks."""
        usable: list[tuple[float, dict]] = []
        for msg in self.in_node_order(replies):
            checked = self.check_evaluation(msg)
            if isinstance(checked, str):
                log(WARNING, "evaluation reply from %s rejected: %s",
                    self.describe(msg.metadata.src_node_id), checked)
            else:
                usable.append(checked)
        metrics = None
        if usable:
            weights = np.array([n for n, _ in usable]) / sum(n for n, _ in usable)
            shared = set.intersection(*(set(m) for _, m in usable))
            metrics = MetricRecord({key: float(sum(w * m[key] for w, (_, m) in
                                                   zip(weights, usable)))
                                    for key in sorted(shared)})
        self.report.evaluate_metrics = dict(metrics or {})
        return metrics

    def check_evaluation(self, msg: Message) -> tuple[float, dict[str, float]] | str:
        """(num-examples, scalar metrics) of an evaluation reply, or why it cannot be used."""
        if msg.has_error():
            return f"error reply: {msg.error.reason}"
        if METRICS not in msg.content.metric_records:
            return f"reply lacks the '{METRICS}' record"
        metrics = read_metrics(msg.content.metric_records[METRICS])
        if isinstance(metrics, str):
            return metrics
        n = metrics.pop(NUM_EXAMPLES, None)
        surveyed = self.survey_count(msg.metadata.src_node_id)
        if not isinstance(n, float) or not 0 < n <= surveyed:
            return f"'{NUM_EXAMPLES}' is {n}; expected 1..{surveyed} (the data survey's count)"
        return min(n, self.weight_cap()), {k: v for k, v in metrics.items()
                                           if isinstance(v, float)}

