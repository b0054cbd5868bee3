"""An experiment: composed by Hydra from the tree in conf/, checked against ExperimentConfig.

Hydra composes the YAML files (the defaults a user reads and overrides: composing.py);
ExperimentConfig is the schema every composed experiment must satisfy. The ``dataset``,
``partition`` and ``model`` sections are checked here against the schema their ``name`` selects. The
``strategy``, ``aggregation`` and ``selection`` sections belong to the server's parts: here
they are open (a name and its settings), and ``driftfl.methods.check_experiment`` checks them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import Field, SerializeAsAny

from .composing import composed
from .dataset_settings import dataset_settings
from .experiment_settings import (  # noqa: F401  (where they were declared before)
    MONTH, ExperimentSettings, Section, SimulationSettings)
from .model_settings import BUILT_IN_MODELS, ModelSettings
from .partition import partition_settings
from .settings import Settings, section, validated


class ExperimentConfig(ExperimentSettings):
    """One experiment, its model section checked against the schema its name selects (a
    user's model's module imports torch); every other setting is declared, with its meaning,
    in ExperimentSettings (experiment_settings.py)."""

    model: SerializeAsAny[ModelSettings] = Field(
        description=ExperimentSettings.model_fields["model"].description)

    @property
    def clients_per_round(self) -> int:
        """The clients a round selects when every node is up: floor(fraction * num_clients),
        at least 1 (DriftStrategy.train_count)."""
        return max(1, math.floor(self.num_clients * self.fraction + 1e-9))

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> ExperimentConfig:
        return experiment_config(json.loads(text))


def model_section(spec: Mapping | ModelSettings) -> ModelSettings:
    """The ``model`` section checked against its model's schema: a built-in's without torch, a
    user's own from its module in driftfl/models/ (which imports torch)."""
    name = spec.name if isinstance(spec, ModelSettings) else spec.get("name")
    if name in BUILT_IN_MODELS and (not isinstance(spec, ModelSettings)
                                    or type(spec) is BUILT_IN_MODELS[name]):
        return section("model", spec, BUILT_IN_MODELS)
    from .models import model_settings

    return model_settings(spec)


# the sections checked here, each against the schema its name selects
SECTIONS: dict[str, Callable[[Mapping], Settings]] = {
    "dataset": dataset_settings, "partition": partition_settings, "model": model_section}


def experiment_config(data: Mapping[str, Any]) -> ExperimentConfig:
    """``data`` checked against ExperimentConfig, and the dataset, partition and model sections
    against the schema each one's name selects; ConfigError names the first problem."""
    data = dict(data)
    for key, check in SECTIONS.items():
        if isinstance(data.get(key), Mapping):
            data[key] = check(data[key])
    return validated(ExperimentConfig, data)


def compose(overrides: list[str]) -> ExperimentConfig:
    """The experiment for these Hydra overrides, like `driftfl run` composes it; its server
    parts are checked by ``driftfl.methods.check_experiment``."""
    return experiment_config(composed(overrides))


