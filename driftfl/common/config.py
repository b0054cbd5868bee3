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
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field, SerializeAsAny, field_validator

from .composing import composed
from .conditions import HeterogeneitySettings
from .datasets import DatasetSettings, dataset_settings
from .models import ModelSettings, model_settings
from .owners import MAX_EXAMPLES_RATIO
from .partition import PartitionSettings, partition_settings
from .privacy import PrivacySettings, SecAggSettings
from .settings import MANY, Settings, validated


class Section(Settings):
    """A section whose schema its ``name`` selects, before it is checked against that schema."""

    model_config = ConfigDict(extra="allow")
    name: str


# Upper bounds no real experiment comes near, so that a slip of the keyboard (rounds=1000000000)
# is refused in one line rather than run for ever or overflow numpy, torch or Flower's int64
# run config: a paper's longest runs are a few thousand rounds of a few hundred local epochs,
# cross-device federations a few thousand clients per machine, and a 30-day timeout already
# outlasts any round.
MONTH = 30 * 24 * 3600  # seconds: round_timeout, node_wait, rejoin_wait


class SimulationSettings(Settings):
    # CPU cores (and torch threads) per simulated client; more than a machine has
    client_cpus: int = Field(1, ge=1, le=1024)
    # GPU share per simulated client; needs device=cuda; a client trains on one GPU
    client_gpus: float = Field(0.0, ge=0, le=1)
    # an existing Ray cluster to run the clients on ('auto' or its head's <host>:<port>, as
    # `ray start --head` prints it); None: a private Ray instance on this machine
    ray_address: str | None = None

    @field_validator("ray_address")
    @classmethod
    def _an_address(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"auto|[A-Za-z0-9_.\-]+:[0-9]{1,5}", value):
            raise ValueError("must be auto or the head node's <host>:<port> (`ray start "
                             "--head` prints it)")
        return value


class ExperimentConfig(Settings):
    """One experiment; conf/config.yaml holds the same defaults (a test keeps them equal)."""

    strategy: SerializeAsAny[Section]
    aggregation: SerializeAsAny[Section]
    selection: SerializeAsAny[Section]
    dataset: SerializeAsAny[DatasetSettings]
    partition: SerializeAsAny[PartitionSettings]
    model: SerializeAsAny[ModelSettings]
    num_clients: int = Field(10, ge=1, le=MANY)
    fraction: float = Field(1.0, gt=0, le=1)
    fraction_evaluate: float = Field(0.0, ge=0, le=1)
    rounds: int = Field(5, ge=1, le=MANY)
    local_epochs: int = Field(1, ge=1, le=MANY)
    batch_size: int = Field(32, ge=1, le=MANY)
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    # numpy's global seed (the ServerApp's np.random.seed) takes 0 .. 2**32 - 1
    seed: int = Field(0, ge=0, le=2**32 - 1)
    device: Literal["cpu", "cuda"] = "cpu"
    eval_batch_size: int | None = Field(None, ge=1, le=MANY)  # None: by device (forward_batch_size)
    logit_shift_samples: int = Field(32, ge=0, le=MANY)
    round_timeout: float = Field(3600.0, gt=0, le=MONTH)
    # the run stops (failed) after this many rounds in a row that asked clients and got no
    # usable reply (out of memory, say: the rounds after would fail alike); 0: never for that
    max_rounds_without_reply: int = Field(3, ge=0, le=MANY)
    # a client's update (and the aggregate) may move the model by at most this many times
    # the global model's norm (at least 1); a larger one is refused as corrupt or hostile
    max_update_ratio: float = Field(10.0, gt=0)
    # a client's update, and every payload of its reply that feeds server state (SCAFFOLD's
    # Delta c, Fisher terms, prototypes, ...), may be at most this many times the round's lower
    # median of the same: one client in the bounds cannot outsize its peers (honest clients
    # measured up to 15x the lower median under Dir(0.1); 30 leaves them a margin)
    max_peer_ratio: float = Field(30.0, ge=1)
    # deployment: a client's aggregation weight counts at most this many times the median of
    # the example counts the data survey found (nodes claim their counts there; simulation's
    # are the server's own and never capped), so no client outweighs the rest by claiming
    max_examples_ratio: float = Field(MAX_EXAMPLES_RATIO, ge=1)
    # whose replies are trusted to follow the method: ``clients`` (each paper's own formula,
    # the screens above only), ``none`` (each client's influence on the model and every state
    # bounded: strategies/parts/bounded.py), ``auto``: clients in simulation, none in deployment
    trust: Literal["auto", "clients", "none"] = "auto"
    # trust=none: each client's update and payload is moved to within this many times the
    # round's lower median distance of the clients' coordinate-wise median
    clip_ratio: float = Field(1.0, gt=0)
    # a client whose replies are rejected this many rounds in a row is excluded from the rest
    # of the run (named once, in summary.json's ``excluded``); 0: never
    exclude_after: int = Field(3, ge=0, le=MANY)
    node_wait: float = Field(600.0, gt=0, le=MONTH)
    # deployment: a round goes on while at least min_clients are connected, after waiting up to
    # rejoin_wait seconds (once per loss) for a lost client to come back
    min_clients: int = Field(1, ge=1, le=MANY)
    rejoin_wait: float = Field(60.0, ge=0, le=MONTH)
    simulation: SimulationSettings = SimulationSettings()
    privacy: PrivacySettings = PrivacySettings()  # user-level differential privacy
    secagg: SecAggSettings = SecAggSettings()  # secure aggregation
    # per-client evaluation: this share of each client's data is held out (seeded, stratified)
    # and never trained on; 0: none, every client trains on all it holds
    client_test_fraction: float = Field(0.0, ge=0, lt=1)
    eval_every: int = Field(1, ge=1, le=MANY)  # ... measured every this many rounds (and last)
    eval_clients: int = Field(0, ge=0, le=MANY)  # ... by at most this many trained clients (0: all)
    # simulated systems heterogeneity: unequal epochs, stragglers, dropout (common/conditions.py)
    heterogeneity: HeterogeneitySettings = HeterogeneitySettings()
    # a deployed federation to run on: the name of a SuperLink connection in flwr's
    # config.toml ($FLWR_HOME, ~/.flwr); None: a private local simulation
    superlink: str | None = None
    # deployment with node authentication: the owners file `driftfl secure register` wrote
    # (node id -> key, partition, examples), a path on the SuperLink's machine; a node may then
    # claim only its key's partition. None: the first node to claim a partition keeps it
    owners: str | None = None
    tracker: Literal["none", "tensorboard"] = "none"  # also stream per-round metrics there
    label: str
    verbose: bool = False

    @field_validator("superlink")
    @classmethod
    def _a_connection_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_\-]+", value):
            raise ValueError("must name a SuperLink connection of ~/.flwr/config.toml "
                             "(letters, digits, - and _)")
        return value

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


# the sections checked here, each against the schema its name selects
SECTIONS: dict[str, Callable[[Mapping], Settings]] = {
    "dataset": dataset_settings, "partition": partition_settings, "model": model_settings}


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


