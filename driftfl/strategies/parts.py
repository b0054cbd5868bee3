"""The parts a strategy is assembled from, by the name their config group gives:
``aggregation=<name>`` and ``selection=<name>`` (conf/aggregation/, conf/selection/)."""

from __future__ import annotations

from .aggregation import Aggregation
from .feddisco import FedDiscoAggregation
from .fednova import FedNovaAggregation
from .robust import KrumAggregation, MedianAggregation, TrimmedMeanAggregation
from .selection import CKASelection, Selection

AGGREGATIONS: dict[str, type[Aggregation]] = {
    "mean": Aggregation, "fednova": FedNovaAggregation, "feddisco": FedDiscoAggregation,
    "median": MedianAggregation, "trimmed_mean": TrimmedMeanAggregation, "krum": KrumAggregation}
SELECTIONS: dict[str, type[Selection]] = {"uniform": Selection, "cka": CKASelection}
