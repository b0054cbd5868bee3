"""The parts a strategy is assembled from, by the name their config group gives:
``aggregation=<name>`` and ``selection=<name>`` (conf/aggregation/, conf/selection/)."""

from __future__ import annotations

from .aggregation import Aggregation
from .feddisco import FedDiscoAggregation
from .fednova import FedNovaAggregation
from .selection import CKASelection, Selection

AGGREGATIONS: dict[str, type[Aggregation]] = {
    "mean": Aggregation, "fednova": FedNovaAggregation, "feddisco": FedDiscoAggregation}
SELECTIONS: dict[str, type[Selection]] = {"uniform": Selection, "cka": CKASelection}
