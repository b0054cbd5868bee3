"""Hydra's half of an experiment: the overrides composed over conf/ into plain settings, with
what Hydra refuses (an unknown or misplaced setting, an unknown option of a config group) said
in one line. Only Hydra and OmegaConf are imported here, not the schema's modules (torch, Flower),
so that `driftfl run` refuses a mistyped setting in a fraction of a second
(benchmarks/typo_refusal.py); ``driftfl.common.config`` then checks the settings' values.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .settings import unknown_key

if TYPE_CHECKING:
    from omegaconf import DictConfig

# conf/ sits beside the package, in the source tree and in the Flower app bundle alike.
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
# what the options of a config group are called in a message ("methods that have it")
OPTION_NOUNS = {"strategy": "methods", "model": "models", "dataset": "datasets",
                "partition": "partitions"}


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



def composed(overrides: list[str]) -> dict:
    """The settings these overrides compose (Hydra's section left out, every interpolation
    resolved), not yet checked against the schema; ConfigError names the first key or option
    Hydra cannot use."""
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
        raise ConfigError(_unknown_override(str(err), overrides, _hydra_settings)
                          or one_line(err)) from None
    return hydra


def _hydra_settings(overrides: list[str]) -> dict[str, Any]:
    from omegaconf import OmegaConf

    section = OmegaConf.to_container(hydra_section(overrides))
    return {f"hydra.{key}": value for key, value in _flat(section)}


def _experiment_settings(overrides: list[str]) -> dict[str, Any]:
    return dict(_flat(composed(overrides)))


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
    if not options:
        return None
    where = (f" (searched {conf_dir() / group}/*.yaml, of the driftfl in use, {installation()}; "
             "a model of your own: docs/adding-a-model.md)" if group == "model" else "")
    return f"unknown {group} '{name}'; valid: {', '.join(options)}{where}"


def installation() -> Path:
    """The driftfl package in use, for a message about what it did not find: a user's own
    model or yaml added to another checkout than the one installed is not there."""
    return Path(__file__).resolve().parents[1]


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
                      settings_of: Callable[[list[str]], dict[str, Any]] = _experiment_settings
                      ) -> str | None:
    """Hydra refuses a key the config lacks with advice to add it (`+roundz=3`), which only
    adds a key nothing reads: name the valid key it most likely meant instead, among the
    settings (dotted key -> value) ``settings_of`` the other overrides gives, or the options of
    its config group that have it (``strategy.mu`` under fedavg: fedprox, ...)."""
    found = re.search(r"Could not override '([^']+)'", message)
    if not found:
        return None
    key = found.group(1)
    rest = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != key]
    if (conf_dir() / key).is_dir():  # a group outside the defaults, such as experiment
        given = next((o.lstrip("+~") for o in overrides if o not in rest), f"{key}=...")
        return f"{key} is not in the defaults; add it with +{given}"
    try:
        settings = settings_of(rest)
    except ConfigError:
        return None
    # its first part the config lacks (`partitoin` of partitoin.alpha), and the keys beside
    # that: a section's settings, or the top level's keys and sections
    parts, known = key.split("."), {tuple(k.split(".")[:n]) for k in settings
                                    for n in range(1, k.count(".") + 2)}
    depth = next((n for n in range(len(parts)) if tuple(parts[:n + 1]) not in known), None)
    if depth is None:
        return None
    if depth and (elsewhere := options_with(parts[0], parts[1:])):
        chosen = settings.get(f"{parts[0]}.name", "the chosen one")
        noun = OPTION_NOUNS.get(parts[0], f"{parts[0]} options")
        return (f"{key} is not a setting of {parts[0]}={chosen}; {noun} that have it: "
                f"{', '.join(elsewhere)}")
    scope = "".join(f"{part}." for part in parts[:depth])
    beside = {k[len(scope):].split(".")[0] for k in settings if k.startswith(scope)}
    return unknown_key(parts[depth], beside, scope) if beside else None


def options_with(group: str, path: list[str]) -> list[str]:
    """The options of config ``group`` whose yaml holds the setting at ``path`` ([] where
    ``group`` is no config group)."""
    import yaml

    def holds(node, path: list[str]) -> bool:
        return not path or (isinstance(node, dict) and path[0] in node
                            and holds(node[path[0]], path[1:]))

    options = group_options(group) if (conf_dir() / group).is_dir() else []
    return [option for option in options if holds(
        yaml.safe_load((conf_dir() / group / f"{option}.yaml").read_text()), path)]


def experiment_only(cfg: DictConfig) -> dict:
    """The experiment without Hydra's own section, with every interpolation resolved."""
    from omegaconf import OmegaConf
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
