"""The parts a strategy is assembled from, by the name their config group gives:
``aggregation=<name>`` and ``selection=<name>`` (conf/aggregation/, conf/selection/)."""

from __future__ import annotations

from .aggregation import Aggregation
from .fednova import FedNovaAggregation
from .selection import Selection

AGGREGATIONS: dict[str, type[Aggregation]] = {"mean": Aggregation, "fednova": FedNovaAggregation}
SELECTIONS: dict[str, type[Selection]] = {"uniform": Selection}
