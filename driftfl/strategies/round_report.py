"""What a round saw, for its row of metrics.csv and its round line."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RoundReport:
    """What the last round's training saw (and its federated evaluation's metrics)."""

    clients: int = 0
    rejected: list[str] = field(default_factory=list)  # "partition 3 (node 81...): reason"
    rejected_partitions: list[str] = field(default_factory=list)  # as clients.name gives them
    silent: list[int] = field(default_factory=list)  # sent a train message, sent nothing back
    # of those, the lost (by name, and their node ids): the SuperLink reported them
    # unavailable, or (the federation settles it) they are no longer connected
    lost: list[str] = field(default_factory=list)
    lost_nodes: list[int] = field(default_factory=list)
    late: list[str] = field(default_factory=list)  # the others: over round_timeout
    dropped: list[str] = field(default_factory=list)  # heterogeneity: dropped before training
    refused_aggregate: str = ""  # why the aggregate did not replace the global model
    refused_state: list[str] = field(default_factory=list)  # "<state>: reason", state kept
    train_metrics: dict[str, float] = field(default_factory=dict)
    evaluate_metrics: dict[str, float] = field(default_factory=dict)
