"""Server-side strategies: the round every method runs (base.py), the parts it is assembled
from (parts/: selection, aggregation, release, the guard, the known clients, ...) and the
methods (methods/: one a file, named after it). DCFL, whose client and server halves belong
together, is its own package: driftfl/dcfl/."""

from __future__ import annotations

from driftfl.strategies.base import DriftStrategy, StrategySettings
from driftfl.strategies.methods.fedavg import FedAvg
from driftfl.strategies.methods.fedavgm import FedAvgM
from driftfl.strategies.methods.fedcad import FedCAD
from driftfl.strategies.methods.fedcsd import FedCSD
from driftfl.strategies.methods.fedcurv import FedCurv
from driftfl.strategies.methods.feddyn import FedDyn
from driftfl.strategies.methods.fedgkd import FedGKD
from driftfl.strategies.methods.fedproto import FedProto
from driftfl.strategies.methods.fedprox import FedProx
from driftfl.strategies.methods.fedssd import FedSSD
from driftfl.strategies.methods.scaffold import Scaffold
from driftfl.strategies.parts import AGGREGATIONS, SELECTIONS
from driftfl.strategies.parts.aggregation import Aggregation
from driftfl.strategies.parts.fednova import FedNovaAggregation
from driftfl.strategies.parts.selection import Selection

__all__ = ["AGGREGATIONS", "SELECTIONS", "Aggregation", "DriftStrategy", "FedAvg", "FedAvgM",
           "FedCAD", "FedCSD", "FedCurv", "FedDyn", "FedGKD", "FedNovaAggregation", "FedProto",
           "FedProx", "FedSSD", "Scaffold", "Selection", "StrategySettings"]
