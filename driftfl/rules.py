"""Which parts combine: one checker over what each part declares, before anything runs.

Each part says what it needs of the others in its declaration (driftfl.specs: no torch, no
Flower, so that a bad pair is refused at once):

- a strategy (a method's server): ``provides`` (the records and config keys it sends), a
  selection's ``needs`` must be among them; ``unprotected`` (what its clients send that neither
  DP nor SecAgg+ covers) and ``protection_problem(settings)`` (a setting that sends such a
  thing); ``step_budget`` (why a straggler's step budget means nothing for it: DCFL's two
  stages);
- an aggregation: ``individual`` (what it needs of each client's own update, which DP's noise
  is not calibrated to and SecAgg+ hides); its own ``check`` of the round size;
- the release (privacy, secure aggregation) hides each client's own figures, which per-client
  evaluation needs in the clear.

Every refusal is one line that says what would go wrong and what to set instead.
"""

from __future__ import annotations

from collections.abc import Mapping

import yaml

from driftfl.common.composing import conf_dir
from driftfl.common.config import ExperimentConfig
from driftfl.common.errors import ConfigError

# a noise share's coordinate stays within this many stds but with probability exp(-50)
NOISE_TAIL = 10.0
SPEC = "docs/algorithms.md describes each"


def check_parts(cfg: ExperimentConfig, methods: Mapping, aggregations: Mapping,
                selections: Mapping) -> None:
    """ConfigError for the first pair of parts that cannot run together; ``methods``,
    ``aggregations``, ``selections``: the declarations by name (driftfl.specs)."""
    strategy = methods[cfg.strategy.name]
    missing = selections[cfg.selection.name].needs - strategy.provides
    if missing:
        offer = sorted(name for name, method in methods.items()
                       if missing <= method.provides)
        raise ConfigError(f"selection={cfg.selection.name} needs what only strategy="
                          f"{' / '.join(offer)} provides ({', '.join(sorted(missing))}); with "
                          f"strategy={cfg.strategy.name} use selection=uniform ({SPEC})")
    if cfg.min_clients > cfg.num_clients:
        raise ConfigError(f"min_clients={cfg.min_clients} exceeds num_clients="
                          f"{cfg.num_clients}; set min_clients at most num_clients")
    aggregation = aggregations[cfg.aggregation.name]
    aggregation.check(cfg)
    if cfg.heterogeneity.name == "stragglers" and strategy.step_budget:
        raise ConfigError(f"heterogeneity=stragglers with strategy={cfg.strategy.name}: "
                          f"{strategy.step_budget}; use heterogeneity=epochs or dropout")
    if cfg.superlink and getattr(cfg.strategy, "condensation", None) == "real":
        raise ConfigError("strategy.condensation=real ships the clients' own images, a research "
                          "ablation for simulation only (nodes refuse it); on a deployed "
                          "federation use condensation=dm")
    check_client_eval(cfg)
    check_privacy(cfg, strategy, aggregation, methods)
    check_secagg(cfg, strategy, aggregation, methods)


def check_client_eval(cfg: ExperimentConfig) -> None:
    """Per-client evaluation sends each client's accuracy in the clear: not under a release
    that hides each client's own figures."""
    if cfg.client_test_fraction > 0 and cfg.privacy.enabled:
        raise ConfigError(f"client_test_fraction with privacy={cfg.privacy.name}: each "
                          "client's accuracy is a release about its data that no noise covers; "
                          "leave client_test_fraction=0 under differential privacy")
    if cfg.client_test_fraction > 0 and cfg.secagg.enabled:
        raise ConfigError("client_test_fraction with secagg: the server would see each "
                          "client's accuracy beside the sum it may only see; leave "
                          "client_test_fraction=0 under secure aggregation")


def default_aggregation(name: str) -> str:
    """The aggregation a method's yaml chooses (the mean unless it overrides it)."""
    text = (conf_dir() / "strategy" / f"{name}.yaml").read_text()
    for entry in (yaml.safe_load(text) or {}).get("defaults", []):
        if isinstance(entry, dict):
            for key, value in entry.items():
                if "aggregation" in key:
                    return str(value)
    return "mean"


def protected_methods(methods: Mapping) -> list[str]:
    """The methods whose clients send the server only their model and payloads it takes as
    sums, averaged by the mean."""
    return sorted(name for name, method in methods.items()
                  if not method.unprotected and default_aggregation(name) == "mean")


def check_protected(head: str, cfg: ExperimentConfig, strategy, methods: Mapping,
                    uncovered: str) -> None:
    """Refuse a method whose replies DP or SecAgg+ would leave partly uncovered."""
    if strategy.unprotected:
        raise ConfigError(f"{head} strategy={cfg.strategy.name}: {strategy.unprotected} would "
                          f"reach the server {uncovered} what the clients send in "
                          f"{', '.join(protected_methods(methods))}")
    problem = strategy.protection_problem(cfg.strategy)
    if problem:
        raise ConfigError(f"{head} strategy={cfg.strategy.name}: {problem}")


def check_privacy(cfg: ExperimentConfig, strategy, aggregation, methods: Mapping) -> None:
    """Refuse differential privacy where it would not cover what the server receives."""
    if not cfg.privacy.enabled:
        return
    head = f"privacy={cfg.privacy.name} with"
    check_protected(head, cfg, strategy, methods, "without clipping or noise; DP covers")
    if cfg.privacy.payload_clip is not None and not strategy.payload_record:
        raise ConfigError(f"privacy.payload_clip means nothing with strategy="
                          f"{cfg.strategy.name}, whose clients send only their model; "
                          "leave it unset")
    if aggregation.individual:
        raise ConfigError(f"{head} aggregation={cfg.aggregation.name}: "
                          f"{aggregation.individual}, while DP-FedAvg's noise is calibrated to "
                          f"the plain sum of the clipped updates; use aggregation=mean")
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


def check_secagg(cfg: ExperimentConfig, strategy, aggregation, methods: Mapping) -> None:
    """ConfigError for what SecAgg+ cannot serve: an aggregation that needs each update, a
    method whose clients send more than the model, too few clients per round, central DP."""
    if not cfg.secagg.enabled:
        return
    head = f"secagg={cfg.secagg.name}"
    if aggregation.individual:
        raise ConfigError(f"{head} with aggregation={cfg.aggregation.name}: "
                          f"{aggregation.individual}, which secure aggregation hides; use "
                          "aggregation=mean")
    check_protected(f"{head} with", cfg, strategy, methods,
                    "unprotected; secure aggregation covers")
    if cfg.privacy.name == "central":
        raise ConfigError(f"{head} with privacy=central: the server clips each client's "
                          "update, which secure aggregation hides; use privacy=distributed")
    per_round = min(cfg.num_clients, cfg.clients_per_round)
    if cfg.privacy.name == "distributed" and cfg.secagg.clipping_range != "auto":
        # SecAgg+ clips each coordinate it masks (auto: to the noise share's reach)
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

