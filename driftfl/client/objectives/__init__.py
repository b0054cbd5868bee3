"""Local objectives by the name the ``method`` key of a train message carries.

Every module of this package is imported here, and each Objective subclass that sets ``name``
registers itself in OBJECTIVES: adding an objective is adding a module.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import OBJECTIVES, Batch, Objective, build_objective

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["OBJECTIVES", "Batch", "Objective", "build_objective"]
