"""The methods' server halves, one a file named after the method (and what some of them share:
teacher.py, prototypes.py; the aux set, which the server prepares too, is parts/aux_set.py).
Every module here is imported, and each strategy that sets ``method`` registers itself
(registry.py): adding a method's strategy is adding a module."""

from __future__ import annotations

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
