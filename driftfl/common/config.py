"""An experiment: composed by Hydra from the tree in conf/, checked against ExperimentConfig.

Hydra composes the YAML files (the defaults a user reads and overrides); ExperimentConfig is
the schema every composed experiment must satisfy. The ``dataset``, ``partition`` and
``model`` sections are checked here against the schema their ``name`` selects. The
``strategy``, ``aggregation`` and ``selection`` sections belong to the server's parts: here
they are open (a name and its settings), and ``driftfl.methods.check_experiment`` checks them.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf
from pydantic import ConfigDict, Field, SerializeAsAny, field_validator

from .conditions import HeterogeneitySettings
from .datasets import DatasetSettings, dataset_settings
from .errors import ConfigError
from .models import ModelSettings, model_settings
from .partition import PartitionSettings, partition_settings
from .privacy import PrivacySettings, SecAggSettings
from .settings import MANY, Settings, unknown_key, validated

# conf/ sits beside the package, in the source tree and in the Flower app bundle alike.
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


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
    max_examples_ratio: float = Field(10.0, ge=1)
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


def conf_dir() -> Path:
    if not (CONF_DIR / "config.yaml").is_file():
        raise ConfigError(f"the Hydra config tree is missing at {CONF_DIR}; install driftfl from "
                          "its source tree with `pip install -e .`")
    return CONF_DIR


def parse_overrides(text: str) -> list[str]:
    """Overrides as a JSON list (what `driftfl run` passes) or a shell-style string."""
    text = text.strip()
    if text.startswith("["):
        return [str(o) for o in json.loads(text)]
    return shlex.split(text)


def compose(overrides: list[str]) -> ExperimentConfig:
    """The experiment for these Hydra overrides, like `driftfl run` composes it; its server
    parts are checked by ``driftfl.methods.check_experiment``."""
    return experiment_config(_composed(overrides))


def _composed(overrides: list[str]) -> dict:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    _check_names(overrides)
    try:
        with initialize_config_dir(str(conf_dir()), version_base="1.3"):
            cfg = hydra_compose("config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        message = str(err)
        raise ConfigError(_unknown_option(message) or _unknown_override(message, overrides)
                          or _added_twice(message) or one_line(err)) from err
    return experiment_only(cfg)


def first_line(message: str) -> str:
    """Hydra's and OmegaConf's messages go on with details (full_key, object_type, ...) that
    a person does not need."""
    return next((line.strip() for line in message.splitlines() if line.strip()), message)


def group_options(group: str) -> list[str]:
    return sorted(path.stem for path in (conf_dir() / group).glob("*.yaml"))


def _check_names(overrides: list[str]) -> None:
    """Every override names a setting (not ``=3``), and a config group one of its options (not
    ``dataset=``, ``dataset=3`` or ``dataset=null``): Hydra refuses those in many lines or with
    a ValueError's traceback."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:
        return  # Hydra says what it cannot parse
    for override in parsed:
        group, value = override.key_or_group, override.value()
        if not group:
            raise ConfigError(f"the override {override.input_line} names no setting; write "
                              "key=value, e.g. rounds=3")
        if override.is_delete() or override.is_sweep_override():
            continue
        if (conf_dir() / group).is_dir() and not (value and isinstance(value, str | list)):
            raise ConfigError(f"{override.input_line} names no {group}; valid: "
                              f"{', '.join(group_options(group))}")


def hydra_section(overrides: list[str]) -> DictConfig:
    """Hydra's own settings (``hydra.run.dir``, ...) under these ``hydra.*`` overrides, its
    directories resolved (``${now:...}``); ConfigError names the first problem."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(str(conf_dir()), version_base="1.3"):
            hydra = hydra_compose("config", overrides=overrides, return_hydra_config=True).hydra
        str(hydra.run.dir), str(hydra.sweep.dir)
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        raise ConfigError(_unknown_override(str(err), overrides, _hydra_keys)
                          or one_line(err)) from None
    return hydra


def _hydra_keys(overrides: list[str]) -> list[str]:
    return [f"hydra.{key}" for key, _ in _flat(OmegaConf.to_container(hydra_section(overrides)))]


def _experiment_keys(overrides: list[str]) -> list[str]:
    return [key for key, _ in _flat(_composed(overrides))]


def one_line(err: Exception) -> str:
    """An OmegaConf or Hydra error in one line: the key it is about, or Hydra's first line and
    the OmegaConf error under it ("Error merging override hydra.run.dir=null: field ...")."""
    key, cause = getattr(err, "full_key", None), err.__cause__
    line = first_line(getattr(err, "msg", None) or str(err))
    if key:
        return f"{key}: {line}"
    if cause is not None and hasattr(cause, "full_key"):
        return f"{line.rstrip('.')}: {first_line(getattr(cause, 'msg', None) or str(cause))}"
    return line


def _unknown_option(message: str) -> str | None:
    """Hydra refuses an unknown option of a config group (``model=vgg``) in a dozen lines,
    its options and search path among them: say it in the settings' one line instead."""
    found = re.search(r"Could not (?:find|load) '([^']+)/([^'/]+)'", message)
    if not found:
        return None
    group, name = found.groups()
    options = group_options(group)
    return f"unknown {group} '{name}'; valid: {', '.join(options)}" if options else None


def _added_twice(message: str) -> str | None:
    """``+dataset=mnist`` adds a group the defaults already hold: Hydra's advice is about
    writing a defaults list; on the command line the fix is to drop the +."""
    found = re.search(r"Multiple values for ([\w.]+)\. To override a value use "
                      r"'override [\w.]+: ([^']*)'", message)
    if not found:
        return None
    group, name = found.groups()
    return f"{group} is in the defaults already; choose another one without +: {group}={name}"


def _unknown_override(message: str, overrides: list[str],
                      keys_of: Callable[[list[str]], list[str]] = _experiment_keys) -> str | None:
    """Hydra refuses a key the config lacks with advice to add it (`+roundz=3`), which only
    adds a key nothing reads: name the valid key it most likely meant instead, among the keys
    ``keys_of`` the other overrides gives."""
    found = re.search(r"Could not override '([^']+)'", message)
    if not found:
        return None
    key = found.group(1)
    rest = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != key]
    if (conf_dir() / key).is_dir():  # a group outside the defaults, such as experiment
        given = next((o.lstrip("+~") for o in overrides if o not in rest), f"{key}=...")
        return f"{key} is not in the defaults; add it with +{given}"
    try:
        keys = keys_of(rest)
    except ConfigError:
        return None
    # its first part the config lacks (`partitoin` of partitoin.alpha), and the keys beside
    # that: a section's settings, or the top level's keys and sections
    parts, known = key.split("."), {tuple(k.split(".")[:n]) for k in keys
                                    for n in range(1, k.count(".") + 2)}
    depth = next((n for n in range(len(parts)) if tuple(parts[:n + 1]) not in known), None)
    if depth is None:
        return None
    scope = "".join(f"{part}." for part in parts[:depth])
    beside = {k[len(scope):].split(".")[0] for k in keys if k.startswith(scope)}
    return unknown_key(parts[depth], beside, scope) if beside else None


def experiment_only(cfg: DictConfig) -> dict:
    """The experiment without Hydra's own section, with every interpolation resolved."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except OmegaConfBaseException as err:  # ${...} that does not resolve
        raise ConfigError(one_line(err)) from None
    data.pop("hydra", None)
    missing = [key for key, value in _flat(data) if value == "???"]
    if missing:
        raise ConfigError(f"missing required setting(s): {', '.join(missing)}; "
                          f"set them on the command line, e.g. {missing[0]}=...")
    return data


def _flat(data, prefix=""):
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
