"""Every method driftfl offers, by the name ``strategy=`` takes (METHODS: each strategy
registers itself, driftfl/strategies/registry.py), checked and built from an experiment.

A method binds a server strategy (driftfl.strategies) to the local objective its clients run
by default (driftfl.client.objectives), plus its YAML under conf/strategy/. Its settings, the
``strategy`` section, are its strategy's settings and its objective's, each declared once in
its own module; this is where the two halves meet, so the server can check a whole experiment
(and build its strategy) before anything runs. The client and the strategies never import each
other: they agree through driftfl.common, and the objective reads only its own settings.
See docs/adding-a-method.md.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import Field, create_model

import driftfl.dcfl.strategy  # noqa: F401  (DCFL registers itself)
import driftfl.strategies.methods  # noqa: F401  (every method's module, each registering itself)
from driftfl.client.objectives import OBJECTIVES
from driftfl.common.config import ExperimentConfig, experiment_config
from driftfl.common.errors import ConfigError, lookup
from driftfl.common.settings import Named, Settings, validated
from driftfl.rules import SPEC, check_parts
from driftfl.strategies import AGGREGATIONS, SELECTIONS, DriftStrategy
from driftfl.strategies.parts.aux_set import AuxSet
from driftfl.strategies.registry import METHODS, Method

__all__ = ["METHODS", "Method", "build_strategy", "check_experiment", "method_schema",
           "method_settings"]


class MethodHeader(Named):
    objective: str = Field(description=(
        "the clients' local objective (ce: plain cross-entropy); the method's own by default, "
        "and some methods take no other"))


@cache
def method_schema(name: str, objective: str) -> type[Settings]:
    """The ``strategy`` section of method ``name`` run with ``objective``: its name, its
    objective, the objective's settings and the strategy's."""
    strategy = METHODS[name].strategy
    return create_model(f"{name}_{objective}_settings",
                        __base__=(strategy.Settings, OBJECTIVES[objective].Settings, MethodHeader))




def method_settings(section: dict[str, Any]) -> Settings:
    """The ``strategy`` section checked whole: the method, its objective and every setting."""
    try:
        method = lookup("strategy", section.get("name"), METHODS)
        objective = section.setdefault("objective", method.objective)
        lookup("objective", objective, OBJECTIVES)
    except ConfigError as err:
        raise ConfigError(f"{err} ({SPEC})") from None
    if method.objective_fixed and objective != method.objective:
        raise ConfigError(f"strategy={section['name']} needs objective={method.objective} (its "
                          f"server's update assumes its clients train with it), got "
                          f"strategy.objective={objective}; leave strategy.objective out")
    missing = OBJECTIVES[objective].needs - method.strategy.provides
    if missing:
        raise ConfigError(f"objective '{objective}' needs {', '.join(sorted(missing))} from the "
                          f"server, which strategy '{section['name']}' does not send ({SPEC})")
    schema = method_schema(section["name"], objective)
    # with another objective than the method's own, the own one's settings (from its yaml)
    # are not used: leave them out rather than refuse them
    unused = set(OBJECTIVES[method.objective].Settings.model_fields) - set(schema.model_fields)
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
                   "aggregation": _part_settings("aggregation", AGGREGATIONS),
                   "selection": _part_settings("selection", SELECTIONS)}


def check_experiment(cfg: ExperimentConfig | dict[str, Any]) -> ExperimentConfig:
    """The experiment checked whole, its server sections included, and its parts against each
    other (driftfl.rules); ConfigError names the first problem."""
    data = cfg.model_dump() if isinstance(cfg, ExperimentConfig) else dict(cfg)
    checked = experiment_config(data)
    checked = checked.model_copy(update={key: check(getattr(checked, key).model_dump())
                                         for key, check in SERVER_SECTIONS.items()})
    check_parts(checked, METHODS, AGGREGATIONS, SELECTIONS)
    return with_payload_clip(checked)


def with_payload_clip(cfg: ExperimentConfig) -> ExperimentConfig:
    """The experiment with privacy.payload_clip filled in from the method's default, where
    privacy is on and the user left it unset (servers and clients then read one value)."""
    strategy = METHODS[cfg.strategy.name].strategy
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
    return METHODS[cfg.strategy.name].strategy.from_config(cfg, model, aux_set,
                                                          claims_counts)
