"""Local objectives by the name the ``method`` key of a train message carries."""

from __future__ import annotations

from driftfl.common.errors import lookup

from .base import Batch, Objective
from .cad import CAD
from .csd import CSD
from .gkd import GKD
from .lsd import LSD
from .ntd import NTD
from .prox import Prox
from .ssd import SSD

OBJECTIVES: dict[str, type[Objective]] = {
    "ce": Objective,
    "prox": Prox,
    "csd": CSD,
    "lsd": LSD,
    "ntd": NTD,
    "gkd": GKD,
    "ssd": SSD,
    "cad": CAD,
}


def build_objective(name: str, params, job=None) -> Objective:
    return lookup("objective", name, OBJECTIVES)(params, job)


__all__ = ["OBJECTIVES", "Batch", "Objective", "build_objective"]
