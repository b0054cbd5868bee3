"""An experiment's own settings, importable without torch or Flower.

ExperimentSettings declares every top-level setting of an experiment (type, default, range,
meaning) and checks all of them but the sections whose schema a registry holds: ``model`` (a
user's own model declares its settings beside its builder, which imports torch) and the
server's ``strategy``, ``aggregation`` and ``selection`` are open sections here; ``dataset``
and ``partition`` are checked (their schemas' modules need no torch), and so is a built-in
model's section (model_settings.py). ``driftfl run`` checks a composed experiment against it
first, so a bad value (``rounds=-1``, ``lr=abc``, ``dataset.subset=-5``) is refused in well
under a second; ExperimentConfig (config.py) extends it with the full sections, and
`driftfl run --help` renders its fields (driftfl/help.py).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field, SerializeAsAny, field_validator

from .conditions import HeterogeneitySettings
from .dataset_settings import DatasetSettings, dataset_settings
from .model_settings import BUILT_IN_MODELS
from .owners import MAX_EXAMPLES_RATIO
from .partition import PartitionSettings, partition_settings
from .privacy import PrivacySettings, SecAggSettings
from .privacy_floor import PrivacyFloor
from .settings import MANY, Settings, section, validated


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
    client_cpus: int = Field(1, ge=1, le=1024, description=(
        "CPU cores (and torch threads) per simulated client; more than a machine has is "
        "refused"))
    client_gpus: float = Field(0.0, ge=0, le=1, description=(
        "GPU share per simulated client (0.5: two clients per GPU at a time); needs "
        "device=cuda; a client trains on one GPU"))
    node_floors: dict[str, PrivacyFloor] | None = Field(None, description=(
        "per partition id ('3'), the least privacy that simulated node accepts, as a deployed "
        "node's --node-config sets it (min-privacy, min-noise-multiplier, max-clip, "
        "max-cohort, require-secagg): a message asking for less is refused there and counts "
        "as its dropout; deployed nodes never read it; null: none"))
    ray_address: str | None = Field(None, description=(
        "an existing Ray cluster to run the clients on: auto, or its head's <host>:<port> as "
        "`ray start --head` prints it; null: a private Ray instance on this machine"))

    @field_validator("node_floors", mode="before")
    @classmethod
    def _partition_ids(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):  # None: no floors (an override then needs no '+')
            return value
        if bad := [k for k in value if not str(k).isdigit()]:
            raise ValueError(f"simulation.node_floors is keyed by partition id (0, 1, ...), "
                             f"not {bad[0]!r}")
        return {str(int(k)): v for k, v in value.items()}

    @field_validator("ray_address")
    @classmethod
    def _an_address(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"auto|[A-Za-z0-9_.\-]+:[0-9]{1,5}", value):
            raise ValueError("must be auto or the head node's <host>:<port> (`ray start "
                             "--head` prints it)")
        return value


class ExperimentSettings(Settings):
    """One experiment, its registry-selected sections still open; conf/config.yaml holds the
    same defaults (a test keeps them equal)."""

    strategy: SerializeAsAny[Section] = Field(description=(
        "the method: its server strategy, its clients' objective and their settings "
        "(config group strategy; driftfl run --help strategy=NAME lists them)"))
    aggregation: SerializeAsAny[Section] = Field(description=(
        "how the clients' models become the next global model (config group aggregation)"))
    selection: SerializeAsAny[Section] = Field(description=(
        "which clients train each round (config group selection)"))
    dataset: SerializeAsAny[DatasetSettings] = Field(description=(
        "the images, a built-in or your own (config group dataset; docs/own-data.md)"))
    partition: SerializeAsAny[PartitionSettings] = Field(description=(
        "how the training set is split among the clients (config group partition)"))
    model: SerializeAsAny[Section] = Field(description=(
        "the network every client trains (config group model; docs/adding-a-model.md)"))
    num_clients: int = Field(10, ge=1, le=MANY, description=(
        "data owners (simulated SuperNodes)"))
    fraction: float = Field(1.0, gt=0, le=1, description=(
        "share of the clients that train in a round"))
    fraction_evaluate: float = Field(0.0, ge=0, le=1, description=(
        "share of the clients that also test the global model on their own data each round"))
    rounds: int = Field(5, ge=1, le=MANY, description="communication rounds")
    local_epochs: int = Field(1, ge=1, le=MANY, description=(
        "epochs each selected client trains per round"))
    batch_size: int = Field(32, ge=1, le=MANY, description="the clients' training batch size")
    lr: float = Field(0.05, gt=0, description="the clients' SGD learning rate")
    momentum: float = Field(0.9, ge=0, lt=1, description="the clients' SGD momentum")
    weight_decay: float = Field(0.0, ge=0, description="the clients' SGD weight decay")
    # numpy's global seed (the ServerApp's np.random.seed) takes 0 .. 2**32 - 1
    seed: int = Field(0, ge=0, le=2**32 - 1, description=(
        "seeds the partition, the initial model, client sampling and shuffling"))
    device: Literal["cpu", "cuda"] = Field("cpu", description=(
        "where clients train and evaluate; cuda needs simulation.client_gpus"))
    eval_batch_size: int | None = Field(None, ge=1, le=MANY, description=(
        "evaluation batch size; null: by device (128 on a CPU, 1024 on a GPU)"))
    logit_shift_samples: int = Field(32, ge=0, le=MANY, description=(
        "local samples on which clients measure KL(local || global) of the logits"))
    round_timeout: float = Field(3600.0, gt=0, le=MONTH, description=(
        "seconds to wait for the clients' replies in a round"))
    max_rounds_without_reply: int = Field(3, ge=0, le=MANY, description=(
        "stop the run (failed) after this many rounds in a row that asked clients and got no "
        "usable reply (out of memory, say: the rounds after would fail alike); 0: never"))
    max_update_ratio: float = Field(10.0, gt=0, description=(
        "a client's update (and the aggregate) may move the model by at most this many times "
        "the global model's norm (at least 1); a larger one is refused as corrupt or hostile"))
    # honest clients measured up to 15x the lower median under Dir(0.1); 30 leaves a margin
    max_peer_ratio: float = Field(30.0, ge=1, description=(
        "a client's update, and every payload of its reply that feeds server state "
        "(SCAFFOLD's Delta c, Fisher terms, prototypes, ...), may be at most this many times "
        "the round's lower median of the same"))
    max_examples_ratio: float = Field(MAX_EXAMPLES_RATIO, ge=1, description=(
        "deployment: a client's aggregation weight counts at most this many times the median "
        "of the example counts the nodes claimed (simulation's counts are never capped)"))
    trust: Literal["auto", "clients", "none"] = Field("auto", description=(
        "whose replies are trusted to follow the method: clients (each paper's own formula, "
        "the screens above only), none (each client's influence on the model and every state "
        "bounded), auto: clients in simulation, none in deployment"))
    clip_ratio: float = Field(1.0, gt=0, description=(
        "trust=none: each client's update and payload is moved to within this many times the "
        "round's lower median distance of the clients' coordinate-wise median"))
    exclude_after: int = Field(3, ge=0, le=MANY, description=(
        "a client whose replies are rejected this many rounds in a row is excluded from the "
        "rest of the run (summary.json's excluded); 0: never"))
    node_wait: float = Field(600.0, gt=0, le=MONTH, description=(
        "seconds to wait for num_clients nodes to connect before giving up"))
    min_clients: int = Field(1, ge=1, le=MANY, description=(
        "deployment: a round goes on while at least this many clients are connected"))
    rejoin_wait: float = Field(60.0, ge=0, le=MONTH, description=(
        "deployment: seconds to wait (once per loss) for a lost client to come back"))
    simulation: SimulationSettings = Field(SimulationSettings(), description=(
        "how the local simulation runs its clients"))
    privacy: PrivacySettings = Field(PrivacySettings(), description=(
        "user-level differential privacy (config group privacy; docs/privacy.md)"))
    secagg: SecAggSettings = Field(SecAggSettings(), description=(
        "secure aggregation (config group secagg; docs/secure-aggregation.md)"))
    client_test_fraction: float = Field(0.0, ge=0, lt=1, description=(
        "per-client evaluation: this share of each client's data is held out (seeded, "
        "stratified) and never trained on; 0: none, every client trains on all it holds"))
    eval_every: int = Field(1, ge=1, le=MANY, description=(
        "per-client evaluation every this many rounds (and the last)"))
    eval_clients: int = Field(0, ge=0, le=MANY, description=(
        "per-client evaluation by at most this many of the round's trained clients; 0: all"))
    heterogeneity: HeterogeneitySettings = Field(HeterogeneitySettings(), description=(
        "simulated systems heterogeneity: unequal epochs, stragglers, dropout (config group "
        "heterogeneity)"))
    superlink: str | None = Field(None, description=(
        "a deployed federation to run on: a SuperLink connection in flwr's config.toml "
        "($FLWR_HOME, ~/.flwr); null: a private local simulation"))
    owners: str | None = Field(None, description=(
        "deployment with node authentication: the owners file `driftfl secure register` wrote, "
        "a path on the SuperLink's machine; a node may then claim only its key's partition. "
        "null: the first node to claim a partition keeps it"))
    tracker: Literal["none", "tensorboard", "mlflow", "wandb"] = Field("none", description=(
        "also stream per-round metrics there (<run dir>/tensorboard; mlflow: the store "
        "MLFLOW_TRACKING_URI names; wandb: Weights & Biases, offline under <run dir>/wandb "
        "unless WANDB_MODE says otherwise)"))
    label: str = Field(description=(
        "this run's name in `driftfl report` tables (conf/config.yaml: the strategy's name)"))
    verbose: bool = Field(False, description="also show Flower's own log lines")

    @field_validator("superlink")
    @classmethod
    def _a_connection_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_\-]+", value):
            raise ValueError("must name a SuperLink connection of ~/.flwr/config.toml "
                             "(letters, digits, - and _)")
        return value


def settings_problem(data: Mapping[str, Any]) -> str | None:
    """The first problem among a composed experiment's settings that need neither torch nor
    Flower to check (all but a user's model and the server sections), in one line; None when
    there is none. The same declarations check them again in the full check, in the same order
    (config.experiment_config: dataset, partition, model, then the rest)."""
    from .errors import ConfigError

    data = dict(data)
    try:
        if isinstance(data.get("dataset"), Mapping):
            data["dataset"] = dataset_settings(data["dataset"])
        if isinstance(data.get("partition"), Mapping):
            data["partition"] = partition_settings(data["partition"])
        model = data.get("model")
        if isinstance(model, Mapping) and model.get("name") in BUILT_IN_MODELS:
            section("model", model, BUILT_IN_MODELS)  # a user's model: the full check's
        validated(ExperimentSettings, data)
    except ConfigError as err:
        return str(err)
    return None
