"""Every method by the name ``strategy=`` takes, filled in as the methods' modules load.

A DriftStrategy subclass that sets ``method`` registers itself with its default objective, and
each of its ``variants``: methods that are the same server with another local objective (their
yaml may choose other parts, as FedNova's chooses aggregation=fednova). There is no list to edit:
adding a method is adding its modules and its yaml (docs/adding-a-method.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Method:
    strategy: Any  # the server side: a DriftStrategy subclass
    objective: str  # the clients' local objective unless strategy.objective says otherwise
    # the server's update holds only for clients that train with this objective (SCAFFOLD's
    # control variates, FedDyn's linear term): strategy.objective cannot change it
    objective_fixed: bool = False


METHODS: dict[str, Method] = {}


def register(name: str, method: Method) -> None:
    """Add a method; a name taken by another class is a mistake to stop at once."""
    known = METHODS.get(name)
    if known is not None and _where(known.strategy) != _where(method.strategy):
        raise TypeError(f"two methods are named '{name}': {_where(known.strategy)} and "
                        f"{_where(method.strategy)}; rename one")
    METHODS[name] = method


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def written_columns() -> frozenset[str]:
    """The row columns any registered strategy writes itself (its ``server_columns``), less
    those that record its clients' own figures (``client_figures``, DCFL's condense_seconds):
    no client metric may name one, whichever method runs."""
    return frozenset(column for method in METHODS.values()
                     for column in method.strategy.server_columns
                     - method.strategy.client_figures)
