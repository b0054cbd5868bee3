"""Server-side strategies by name: Flower's where Flower has them, extended by DriftStrategy."""

from __future__ import annotations

from .base import DriftStrategy
from .fednova import FedNova
from .registry import (STRATEGIES, FedAvg, FedAvgM, FedProx, build_strategy, check_strategy,
                       server_holdout)

__all__ = ["STRATEGIES", "DriftStrategy", "FedAvg", "FedAvgM", "FedNova", "FedProx",
           "build_strategy", "check_strategy", "server_holdout"]
