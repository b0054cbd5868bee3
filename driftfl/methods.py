"""Every method driftfl offers, by the name ``strategy=`` takes: one line each in METHODS.

A method binds a server strategy (driftfl.strategies) to the local objective its clients run
by default (driftfl.client.objectives), plus its YAML under conf/strategy/. Its settings, the
``strategy`` section, are its strategy's settings and its objective's, each declared once in
its own module; this is where the two halves meet, so the server can check a whole experiment
(and build its strategy) before anything runs. The client and the strategies never import each
other: they agree through driftfl.common, and the objective reads only its own settings.
See docs/adding-a-method.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Any

from pydantic import create_model

from driftfl.client.objectives import OBJECTIVES
from driftfl.common.config import ExperimentConfig, experiment_config
from driftfl.common.errors import ConfigError, lookup
from driftfl.common.settings import Named, Settings, validated
from driftfl.strategies import (AGGREGATIONS, DCFL, SELECTIONS, DriftStrategy, FedAvg, FedAvgM,
                                FedCAD, FedCSD, FedCurv, FedDyn, FedGKD, FedProto, FedProx, FedSSD,
                                Scaffold)
from driftfl.strategies.aux_set import AuxSet


@dataclass(frozen=True)
class Method:
    strategy: type[DriftStrategy]  # the server side
    objective: str  # the clients' local objective unless strategy.objective says otherwise
    # the server's update holds only for clients that train with this objective (SCAFFOLD's
    # control variates, FedDyn's linear term): strategy.objective cannot change it
    objective_fixed: bool = False


METHODS: dict[str, Method] = {
    "fedavg": Method(FedAvg, "ce"),
    "fedprox": Method(FedProx, "prox"),
    "fedavgm": Method(FedAvgM, "ce"),
    "fednova": Method(FedAvg, "ce"),  # its yaml chooses aggregation=fednova
    "fedcsd": Method(FedCSD, "csd"),
    "fedlsd": Method(FedAvg, "lsd"),
    "fedntd": Method(FedAvg, "ntd"),
    "fedgkd": Method(FedGKD, "gkd"),
    "moon": Method(FedAvg, "moon"),
    "fedproto": Method(FedProto, "proto"),
    "fedssd": Method(FedSSD, "ssd"),
    "fedcad": Method(FedCAD, "cad"),
    "feddisco": Method(FedAvg, "ce"),  # its yaml chooses aggregation=feddisco
    "dcfl": Method(DCFL, "ce"),  # its yaml chooses selection=cka
    "scaffold": Method(Scaffold, "scaffold", objective_fixed=True),
    "feddyn": Method(FedDyn, "dyn", objective_fixed=True),
    "fedcurv": Method(FedCurv, "curv"),
}


# methods whose yaml chooses another aggregation than the mean
NOT_MEAN = frozenset({"fednova", "feddisco"})


class MethodHeader(Named):
    objective: str


@cache
def method_schema(name: str, objective: str) -> type[Settings]:
    """The ``strategy`` section of method ``name`` run with ``objective``: its name, its
    objective, the objective's settings and the strategy's."""
    strategy = METHODS[name].strategy
    return create_model(f"{name}_{objective}_settings",
                        __base__=(strategy.Settings, OBJECTIVES[objective].Settings, MethodHeader))


SPEC = "docs/algorithms.md describes each"


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
    """The experiment checked whole, its server sections included; ConfigError names the
    first problem."""
    data = cfg.model_dump() if isinstance(cfg, ExperimentConfig) else dict(cfg)
    checked = experiment_config(data)
    checked = checked.model_copy(update={key: check(getattr(checked, key).model_dump())
                                         for key, check in SERVER_SECTIONS.items()})
    strategy = METHODS[checked.strategy.name].strategy
    missing = SELECTIONS[checked.selection.name].needs - strategy.provides
    if missing:
        offer = sorted(name for name, method in METHODS.items()
                       if missing <= method.strategy.provides)
        raise ConfigError(f"selection={checked.selection.name} needs what only strategy="
                          f"{' / '.join(offer)} provides ({', '.join(sorted(missing))}); with "
                          f"strategy={checked.strategy.name} use selection=uniform ({SPEC})")
    if checked.min_clients > checked.num_clients:
        raise ConfigError(f"min_clients={checked.min_clients} exceeds num_clients="
                          f"{checked.num_clients}; set min_clients at most num_clients")
    AGGREGATIONS[checked.aggregation.name].check(checked)
    check_privacy(checked)
    check_secagg(checked)
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


def protected_methods() -> list[str]:
    """The methods whose clients send the server only their model and payloads it takes as
    sums, averaged by the mean."""
    return sorted(name for name, method in METHODS.items()
                  if not method.strategy.unprotected and name not in NOT_MEAN)


def check_privacy(cfg: ExperimentConfig) -> None:
    """Refuse differential privacy where it would not cover what the server receives: a
    method's payloads beside the model, a rule other than the mean the noise is calibrated to,
    the clients' own accuracies."""
    if not cfg.privacy.enabled:
        return
    head = f"privacy={cfg.privacy.name} with"
    strategy = METHODS[cfg.strategy.name].strategy
    if strategy.unprotected:
        raise ConfigError(f"{head} strategy={cfg.strategy.name}: {strategy.unprotected} would "
                          f"reach the server without clipping or noise; DP covers what the "
                          f"clients send in {', '.join(protected_methods())}")
    problem = strategy.protection_problem(cfg.strategy)
    if problem:
        raise ConfigError(f"{head} strategy={cfg.strategy.name}: {problem}")
    if cfg.privacy.payload_clip is not None and not strategy.payload_record:
        raise ConfigError(f"privacy.payload_clip means nothing with strategy="
                          f"{cfg.strategy.name}, whose clients send only their model; "
                          "leave it unset")
    if cfg.aggregation.name != "mean":
        raise ConfigError(f"{head} aggregation={cfg.aggregation.name}: DP-FedAvg's noise is "
                          f"calibrated to the plain mean of the clipped updates; use "
                          f"aggregation=mean")
    if cfg.fraction_evaluate > 0:
        raise ConfigError(f"{head} fraction_evaluate={cfg.fraction_evaluate:g}: each client's "
                          "accuracy on its own data would reach the server without noise; set "
                          "fraction_evaluate=0")
    privacy, per_round = cfg.privacy, cfg.clients_per_round
    if privacy.name == "distributed" and privacy.noise_shares(per_round) > per_round:
        raise ConfigError(f"privacy.min_survivors={privacy.min_survivors} asks for "
                          f"{privacy.noise_shares(per_round)} noise shares, but a round selects "
                          f"{per_round} clients (num_clients={cfg.num_clients}, fraction="
                          f"{cfg.fraction:g}); set privacy.min_survivors at most {per_round}")
    if privacy.adaptive_clip and privacy.noise_multiplier > 0:
        count_noise = privacy.count_noise or cfg.fraction * cfg.num_clients / 20
        if privacy.noise_multiplier >= 2 * count_noise:
            raise ConfigError(f"privacy.adaptive_clip: the count's noise std {count_noise:g} "
                              f"leaves nothing of noise_multiplier={privacy.noise_multiplier:g} "
                              f"for the update (it needs count_noise > noise_multiplier / 2); "
                              f"set privacy.count_noise={privacy.noise_multiplier:g} or more")

# a noise share's coordinate stays within this many stds but with probability exp(-50)
NOISE_TAIL = 10.0

# what each aggregation other than the plain mean needs that secure aggregation hides
SECAGG_LOSES = {
    "krum": "Krum scores every client's individual update",
    "median": "the coordinate-wise median needs every client's individual update",
    "trimmed_mean": "the trimmed mean sorts every client's individual update",
    "fednova": "FedNova normalises each client's update by its own step count",
    "feddisco": "FedDisco reweighs each client's individual update by its label discrepancy",
}


def check_secagg(cfg: ExperimentConfig) -> None:
    """ConfigError for what SecAgg+ cannot serve: an aggregation that needs each update, a
    method whose clients send more than the model, too few clients per round, central DP."""
    if not cfg.secagg.enabled:
        return
    head = f"secagg={cfg.secagg.name}"
    aggregation = cfg.aggregation.name
    if aggregation != "mean":
        loses = SECAGG_LOSES.get(aggregation, f"aggregation={aggregation} needs each update")
        raise ConfigError(f"{head} with aggregation={aggregation}: {loses}, which secure "
                          "aggregation hides; use aggregation=mean")
    strategy = METHODS[cfg.strategy.name].strategy
    if strategy.unprotected:
        raise ConfigError(f"{head} with strategy={cfg.strategy.name}: {strategy.unprotected} "
                          f"would reach the server unprotected; secure aggregation covers what "
                          f"the clients send in {', '.join(protected_methods())}")
    problem = strategy.protection_problem(cfg.strategy)
    if problem:
        raise ConfigError(f"{head} with strategy={cfg.strategy.name}: {problem}")
    if cfg.privacy.name == "central":
        raise ConfigError(f"{head} with privacy=central: the server clips each client's "
                          "update, which secure aggregation hides; use privacy=distributed")
    per_round = min(cfg.num_clients, max(1, math.floor(cfg.num_clients * cfg.fraction + 1e-9)))
    if cfg.privacy.name == "distributed":  # SecAgg+ clips each coordinate it masks
        privacy = cfg.privacy
        share = privacy.share_noise_std(privacy.noise_shares(per_round))
        reach = privacy.clip + NOISE_TAIL * share
        if reach > cfg.secagg.clipping_range:
            raise ConfigError(f"{head} with privacy=distributed: each client's noise share (std "
                              f"{share:.3g}) would be clipped by secagg.clipping_range="
                              f"{cfg.secagg.clipping_range:g}, and the sum would carry less "
                              f"noise than accounted; set secagg.clipping_range={reach:.3g} or "
                              "more")
    neighbourhood, threshold = cfg.secagg.protocol_sizes(per_round)
    if per_round < 2 or neighbourhood < threshold:
        raise ConfigError(f"{head} with {per_round} client(s) per round (num_clients="
                          f"{cfg.num_clients}, fraction={cfg.fraction:g}): SecAgg+ needs at "
                          f"least {max(2, threshold)} (secagg.reconstruction_threshold="
                          f"{cfg.secagg.reconstruction_threshold}); add clients or lower "
                          "secagg.reconstruction_threshold")


def build_strategy(cfg: ExperimentConfig, model, aux_set: AuxSet | None = None,
                   deployed: bool = False) -> DriftStrategy:
    """The strategy of a checked experiment (``check_experiment``); ``deployed``: its nodes
    claim their example counts (DriftStrategy.from_config)."""
    return METHODS[cfg.strategy.name].strategy.from_config(cfg, model, aux_set, deployed)
