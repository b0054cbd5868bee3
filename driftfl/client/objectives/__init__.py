"""Local objectives by the name the ``method`` key of a train message carries."""

from __future__ import annotations

from driftfl.common.errors import lookup

from .base import Batch, Objective
from .prox import Prox

OBJECTIVES: dict[str, type[Objective]] = {
    "ce": Objective,
    "prox": Prox,
}


def build_objective(name: str, params, message) -> Objective:
    return lookup("objective", name, OBJECTIVES)(params, message)


__all__ = ["OBJECTIVES", "Batch", "Objective", "build_objective"]
