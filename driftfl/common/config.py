"""Compose experiments from the Hydra tree in conf/ and check the settings every run shares."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError

# conf/ sits beside the package, in the source tree and in the Flower app bundle alike.
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


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


def compose(overrides: list[str]) -> DictConfig:
    """The experiment config for these Hydra overrides, like `driftfl run` composes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(str(conf_dir()), version_base="1.3"):
            cfg = hydra_compose("config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(str(err).strip()) from err
    return experiment_only(cfg)


def experiment_only(cfg: DictConfig) -> DictConfig:
    """The experiment without Hydra's own section, with every interpolation resolved."""
    data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    data.pop("hydra", None)
    missing = [key for key, value in _flat(data) if value == "???"]
    if missing:
        raise ConfigError(f"missing required setting(s): {', '.join(missing)}; "
                          f"set them on the command line, e.g. {missing[0]}=...")
    return OmegaConf.create(data)


def _flat(data, prefix=""):
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def to_json(cfg: DictConfig) -> str:
    return json.dumps(OmegaConf.to_container(cfg, resolve=True), sort_keys=True)


def from_json(text: str) -> DictConfig:
    return OmegaConf.create(json.loads(text))


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def check_settings(cfg: DictConfig) -> None:
    """The shared numeric settings; names (strategy, dataset, ...) are checked where they live."""
    def number(key, kind=float):
        value = OmegaConf.select(cfg, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        if kind is int and int(value) != value:
            raise ConfigError(f"{key} must be a whole number, got {value!r}")
        return value

    _require(number("num_clients", int) >= 1, f"num_clients must be >= 1, got {cfg.num_clients}")
    _require(0 < number("fraction") <= 1, f"fraction must be in (0, 1], got {cfg.fraction}")
    _require(number("rounds", int) >= 1, f"rounds must be >= 1, got {cfg.rounds}")
    _require(number("local_epochs", int) >= 1,
             f"local_epochs must be >= 1, got {cfg.local_epochs}")
    _require(number("batch_size", int) >= 1, f"batch_size must be >= 1, got {cfg.batch_size}")
    _require(number("eval_batch_size", int) >= 1,
             f"eval_batch_size must be >= 1, got {cfg.eval_batch_size}")
    _require(number("lr") > 0, f"lr must be > 0, got {cfg.lr}")
    _require(0 <= number("momentum") < 1, f"momentum must be in [0, 1), got {cfg.momentum}")
    _require(number("weight_decay") >= 0, f"weight_decay must be >= 0, got {cfg.weight_decay}")
    number("seed", int)
    _require(number("simulation.client_cpus", int) >= 1,
             f"simulation.client_cpus must be >= 1, got {cfg.simulation.client_cpus}")
    _require(number("simulation.client_gpus") >= 0,
             f"simulation.client_gpus must be >= 0, got {cfg.simulation.client_gpus}")
    _require(cfg.device in ("cpu", "cuda"), f"device must be cpu or cuda, got '{cfg.device}'")
    if cfg.device == "cuda":
        import torch

        _require(torch.cuda.is_available(),
                 "device=cuda but PyTorch sees no CUDA GPU here; use device=cpu")
    for key in ("subset", "test_subset"):
        value = cfg.dataset.get(key)
        _require(value is None or (isinstance(value, int) and value >= 1),
                 f"dataset.{key} must be a positive whole number or null, got {value!r}")
