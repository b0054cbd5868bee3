"""The parts a strategy is assembled from, by the name their config group gives:
``aggregation=<name>`` and ``selection=<name>`` (conf/aggregation/, conf/selection/)."""

from __future__ import annotations

from driftfl.strategies.parts.aggregation import Aggregation
from driftfl.strategies.parts.feddisco import FedDiscoAggregation
from driftfl.strategies.parts.fednova import FedNovaAggregation
from driftfl.strategies.parts.robust import (KrumAggregation, MedianAggregation,
                                             TrimmedMeanAggregation)
from driftfl.dcfl.selection import CKASelection
from driftfl.strategies.parts.selection import Selection

AGGREGATIONS: dict[str, type[Aggregation]] = {
    "mean": Aggregation, "fednova": FedNovaAggregation, "feddisco": FedDiscoAggregation,
    "median": MedianAggregation, "trimmed_mean": TrimmedMeanAggregation, "krum": KrumAggregation}
SELECTIONS: dict[str, type[Selection]] = {"uniform": Selection, "cka": CKASelection}
