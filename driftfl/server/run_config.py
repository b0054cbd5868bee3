"""The ServerApp's run config: Hydra overrides (``overrides``), where the run directory goes
(``run-dir``), whether to resume, and Flower's usual keys for the common settings, so that a
Flower user's ``flwr run . local --run-config "num-server-rounds=3"`` works as they expect.

Every Flower-style key defaults to "unset" (0, 0.0, "" or -1): then the experiment's own
setting (conf/, ``overrides``) applies. A setting given both ways is refused."""

from __future__ import annotations

from collections.abc import Mapping

from driftfl.common.composing import parse_overrides
from driftfl.common.errors import ConfigError

# Flower's key -> (the driftfl setting, the value that leaves it unset); pyproject.toml's
# [tool.flwr.app.config] declares the same keys with these values (a test checks it)
FLOWER_KEYS = {
    "num-server-rounds": ("rounds", 0),
    "local-epochs": ("local_epochs", 0),
    "batch-size": ("batch_size", 0),
    "lr": ("lr", 0.0),
    "fraction-train": ("fraction", 0.0),
    "seed": ("seed", -1),
    "strategy": ("strategy", ""),
}


def experiment_overrides(run_config: Mapping) -> list[str]:
    """The Hydra overrides this run config asks for: ``overrides`` and the Flower-style keys
    that are set."""
    overrides = parse_overrides(str(run_config.get("overrides", "")))
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    for key, (setting, unset) in FLOWER_KEYS.items():
        value = run_config.get(key, unset)
        if value == unset:
            continue
        if setting in given:
            raise ConfigError(f"{setting} is set twice, by the run config's {key}={value!r} and "
                              f"in its overrides; keep one")
        overrides.append(f"{setting}={value}")
    return overrides
