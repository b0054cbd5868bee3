"""What a declaration is, and the registries of methods and objectives by name (driftfl.specs
fills them with the built-ins)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from driftfl.common.settings import NoSettings, Settings, StrategySettings


def no_problem(settings: Any) -> str | None:
    return None


@dataclass(frozen=True)
class MethodSpec:
    """A method by the name ``strategy=`` takes. ``objective``: its clients' local objective
    unless strategy.objective says otherwise, and ``objective_fixed``: the server's update holds
    only with it; ``provides``: the records and config keys its server sends (an objective's or
    a selection's ``needs`` must be among them); ``unprotected``: what its clients send that
    neither DP nor SecAgg+ covers ("": nothing), and ``protection_problem(settings)``: a setting
    that sends such a thing; ``payload_record``: the reply record of a payload the release takes
    as a sum beside the update, ``payload_clip`` privacy.payload_clip's default for it;
    ``step_budget``: why a straggler's step budget means nothing for it ("": it does);
    ``server``: for a variant, the method whose server it runs with another objective."""

    name: str
    Settings: type[Settings] = StrategySettings
    objective: str = "ce"
    objective_fixed: bool = False
    provides: frozenset[str] = frozenset()
    unprotected: str = ""
    protection_problem: Callable[[Any], str | None] = no_problem
    payload_record: str = ""
    payload_clip: float = 1.0
    step_budget: str = ""
    server: str = ""

    def variant(self, name: str, objective: str) -> MethodSpec:
        """This method's server with another objective, under its own name."""
        return replace(self, name=name, objective=objective, objective_fixed=False,
                       server=self.name)


@dataclass(frozen=True)
class ObjectiveSpec:
    """A local objective by the name ``strategy.objective`` takes; ``needs``: what its server
    must send (a method's ``provides``)."""

    name: str
    Settings: type[Settings] = NoSettings
    needs: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PartSpec:
    """A selection or aggregation by the name its config group takes. ``needs``: what the
    strategy must provide (a selection's); ``individual``: what an aggregation needs of each
    client's own update, which DP's noise is not calibrated to and SecAgg+ hides ("": nothing);
    ``check(cfg)``: ConfigError for an experiment the part cannot serve."""

    name: str
    Settings: type[Settings] = NoSettings
    needs: frozenset[str] = frozenset()
    individual: str = ""
    check: Callable[[Any], None] = field(default=lambda cfg: None)


METHOD_SPECS: dict[str, MethodSpec] = {}
OBJECTIVE_SPECS: dict[str, ObjectiveSpec] = {}


def declare_method(spec: MethodSpec, variants: dict[str, str] | None = None) -> MethodSpec:
    """Register ``spec`` and its ``variants`` (name -> objective). Two classes claiming one
    name are stopped by the classes' registry (driftfl.strategies.registry), before this."""
    for declared in (spec, *(spec.variant(n, o) for n, o in (variants or {}).items())):
        METHOD_SPECS[declared.name] = declared
    return spec


def declare_objective(spec: ObjectiveSpec) -> ObjectiveSpec:
    OBJECTIVE_SPECS[spec.name] = spec
    return spec


def variants_of(name: str) -> dict[str, str]:
    """The methods that run method ``name``'s server with another objective: name -> objective."""
    return {n: s.objective for n, s in METHOD_SPECS.items() if s.server == name}
