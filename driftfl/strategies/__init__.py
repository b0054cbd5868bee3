"""Server-side strategies: Flower's where Flower has them, assembled from driftfl's parts."""

from __future__ import annotations

from .aggregation import Aggregation
from .base import DriftStrategy, StrategySettings
from .baselines import FedAvg, FedAvgM, FedProx
from .dcfl import DCFL
from .fedcad import FedCAD
from .fedcsd import FedCSD
from .fedcurv import FedCurv
from .feddyn import FedDyn
from .fednova import FedNovaAggregation
from .fedproto import FedProto
from .fedssd import FedSSD
from .parts import AGGREGATIONS, SELECTIONS
from .scaffold import Scaffold
from .selection import Selection
from .teacher import FedGKD

__all__ = ["AGGREGATIONS", "DCFL", "SELECTIONS", "Aggregation", "DriftStrategy", "FedAvg",
           "FedAvgM", "FedCAD", "FedCSD", "FedCurv", "FedDyn", "FedGKD", "FedNovaAggregation",
           "FedProto", "FedProx", "FedSSD", "Scaffold", "Selection", "StrategySettings"]
