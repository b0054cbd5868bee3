"""Every method driftfl offers, by the name ``strategy=`` takes, checked and built from an
experiment.

A method binds a server strategy (driftfl.strategies) to the local objective its clients run
by default (driftfl.client.objectives), plus its YAML under conf/strategy/. Its settings, the
``strategy`` section, are its strategy's settings and its objective's, each declared once
(driftfl.specs); this is where the two halves meet, so a whole experiment is checked before
anything runs, and without torch or Flower: a refusal takes a blink. Building the strategy
(``build_strategy``) imports the strategies; METHODS, the strategy classes by name (each
registers itself, driftfl/strategies/registry.py), loads them on first use. The client and the
strategies never import each other: they agree through driftfl.common, and the objective reads
only its own settings. See docs/adding-a-method.md.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from pydantic import Field, create_model

from driftfl.common.config import ExperimentConfig, experiment_config
from driftfl.common.errors import ConfigError, lookup
from driftfl.common.settings import Named, Settings, validated
from driftfl.rules import SPEC, check_parts
from driftfl.specs import AGGREGATION_SPECS, METHOD_SPECS, OBJECTIVE_SPECS, SELECTION_SPECS

if TYPE_CHECKING:
    from driftfl.strategies import DriftStrategy
    from driftfl.strategies.parts.aux_set import AuxSet

__all__ = ["build_strategy", "check_experiment", "method_schema",
           "method_settings"]


def __getattr__(name: str) -> Any:
    """METHODS and Method, the strategy classes' registry, once every strategy has loaded."""
    if name in ("METHODS", "Method"):
        return getattr(_strategies(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _strategies():
    import driftfl.dcfl.strategy  # noqa: F401  (DCFL registers itself)
    import driftfl.strategies.methods  # noqa: F401  (every method's module registers itself)
    from driftfl.strategies import registry

    return registry


class MethodHeader(Named):
    objective: str = Field(description=(
        "the clients' local objective (ce: plain cross-entropy); the method's own by default, "
        "and some methods take no other"))


@cache
def method_schema(name: str, objective: str) -> type[Settings]:
    """The ``strategy`` section of method ``name`` run with ``objective``: its name, its
    objective, the objective's settings and the strategy's."""
    return create_model(f"{name}_{objective}_settings",
                        __base__=(METHOD_SPECS[name].Settings, OBJECTIVE_SPECS[objective].Settings,
                                  MethodHeader))




def method_settings(section: dict[str, Any]) -> Settings:
    """The ``strategy`` section checked whole: the method, its objective and every setting."""
    try:
        method = lookup("strategy", section.get("name"), METHOD_SPECS)
        objective = section.setdefault("objective", method.objective)
        lookup("objective", objective, OBJECTIVE_SPECS)
    except ConfigError as err:
        raise ConfigError(f"{err} ({SPEC})") from None
    if method.objective_fixed and objective != method.objective:
        raise ConfigError(f"strategy={section['name']} needs objective={method.objective} (its "
                          f"server's update assumes its clients train with it), got "
                          f"strategy.objective={objective}; leave strategy.objective out")
    missing = OBJECTIVE_SPECS[objective].needs - method.provides
    if missing:
        raise ConfigError(f"objective '{objective}' needs {', '.join(sorted(missing))} from the "
                          f"server, which strategy '{section['name']}' does not send ({SPEC})")
    schema = method_schema(section["name"], objective)
    # with another objective than the method's own, the own one's settings (from its yaml)
    # are not used: leave them out rather than refuse them
    unused = set(OBJECTIVE_SPECS[method.objective].Settings.model_fields) - set(
        schema.model_fields)
    return validated(schema, {k: v for k, v in section.items() if k not in unused}, "strategy.")


@cache
def _named(settings: type[Settings]) -> type[Settings]:
    return create_model(f"named_{settings.__name__}", __base__=(settings, Named))


def _part_settings(kind: str, table: dict[str, Any]):
    """The check of a part's section (``aggregation``, ``selection``): its name in ``table``,
    then the part's settings."""
    def check(section: dict[str, Any]) -> Settings:
        part = lookup(kind, section.get("name"), table)
        return validated(_named(part.Settings), section, f"{kind}.")
    return check


SERVER_SECTIONS = {"strategy": method_settings,
                   "aggregation": _part_settings("aggregation", AGGREGATION_SPECS),
                   "selection": _part_settings("selection", SELECTION_SPECS)}


def check_experiment(cfg: ExperimentConfig | dict[str, Any]) -> ExperimentConfig:
    """The experiment checked whole, its server sections included, and its parts against each
    other (driftfl.rules); ConfigError names the first problem."""
    data = cfg.model_dump() if isinstance(cfg, ExperimentConfig) else dict(cfg)
    checked = experiment_config(data)
    checked = checked.model_copy(update={key: check(getattr(checked, key).model_dump())
                                         for key, check in SERVER_SECTIONS.items()})
    check_parts(checked, METHOD_SPECS, AGGREGATION_SPECS, SELECTION_SPECS)
    return with_payload_clip(checked)


def with_payload_clip(cfg: ExperimentConfig) -> ExperimentConfig:
    """The experiment with privacy.payload_clip filled in from the method's default, where
    privacy is on and the user left it unset (servers and clients then read one value)."""
    strategy = METHOD_SPECS[cfg.strategy.name]
    if not cfg.privacy.enabled or not strategy.payload_record:
        return cfg
    if cfg.privacy.payload_clip is not None:
        return cfg
    clip = strategy.payload_clip
    return cfg.model_copy(update={"privacy": cfg.privacy.model_copy(
        update={"payload_clip": clip})})


def build_strategy(cfg: ExperimentConfig, model, aux_set: AuxSet | None = None,
                   claims_counts: bool = False) -> DriftStrategy:
    """The strategy of a checked experiment (``check_experiment``); ``claims_counts``: its
    nodes claim their example counts (deployment: DriftStrategy.from_config)."""
    return _strategies().METHODS[cfg.strategy.name].strategy.from_config(
        cfg, model, aux_set, claims_counts)
