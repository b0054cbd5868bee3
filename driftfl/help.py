"""`driftfl run --help`: the config groups and every setting, rendered from the pydantic models
that check them (name, type and range, default, meaning), so the help cannot drift from what
is accepted. A setting added to a model shows up here with no change to this file.

    driftfl run --help                      the groups, their options, every top-level setting
                                            and the settings of each group's default option
    driftfl run --help strategy=dcfl        ... with the options named instead (their values
                                            with the other overrides given, too)
"""

from __future__ import annotations

import textwrap
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

WIDTH = 100
INDENT = "      "  # a setting's meaning, below its name

HEADER = """usage: driftfl run [-m] [--cfg job] [overrides]

An override is key=value (rounds=20, strategy.mu=0.01) or a config group's option
(strategy=fedprox); -m sweeps comma-separated values (driftfl run -m seed=0,1,2). Every bad key
or value is refused in one line before anything runs. Hydra's own flags: driftfl run --hydra-help
"""


def type_name(annotation: Any) -> str:
    """'int', 'float or null', 'cpu | cuda', 'list of int' ... of a field's annotation."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated or getattr(origin, "__name__", "") == "SerializeAsAny":
        return type_name(args[0])  # the constraints are the field's bounds, shown apart
    if origin is Literal:
        return " | ".join(str(v) for v in args)
    if origin in (typing.Union, types.UnionType):
        names = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin is not None:  # list[int], tuple[int, ...]
        return f"{origin.__name__} of {type_name(args[0])}" if args else origin.__name__
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def shown(value: Any) -> str:
    """A value as an override writes it (null, true, [1, 2])."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return str(value)


def field_head(name: str, field: FieldInfo, option: str | None = None) -> str:
    """'rounds: int in [1, 1000000] = 5'; a config group's section shows its default option,
    another required field no default."""
    from driftfl.common.settings import bounds_text

    if option is not None:
        return f"{name}: config group = {option}"
    kind = type_name(field.annotation)
    if bounds := bounds_text(field.metadata):
        kind = f"{kind} {bounds}"
    if field.is_required() or kind == "section":  # a section's defaults: its keys' own
        return f"{name}: {kind}"
    return f"{name}: {kind} = {shown(default_of(field))}"


def default_of(field: FieldInfo) -> Any:
    return field.get_default(call_default_factory=True)


def field_lines(name: str, field: FieldInfo, here: tuple = (), option: str | None = None
                ) -> list[str]:
    """A setting: its head line, then its meaning wrapped below it. ``here``: (its value with
    the overrides given,), shown where it differs from the default; ``option``: the default
    option of the config group the setting is."""
    head = f"  {field_head(name, field, option)}"
    if here:
        value = here[0].get("name") if option is not None and isinstance(here[0], Mapping) \
            else here[0]
        default = option if option is not None else (
            None if field.is_required() else default_of(field))
        if value != default and not isinstance(value, Mapping):
            head += f"  (here: {shown(value)})"
    lines = [head]
    if field.description:
        lines += textwrap.wrap(field.description, WIDTH, initial_indent=INDENT,
                               subsequent_indent=INDENT)
    return lines


def model_lines(model: type[BaseModel], prefix: str = "", values: Mapping | None = None,
                options: Mapping[str, str] | None = None) -> list[str]:
    """Every field of ``model`` but a section's ``name``, a nested settings model's fields
    under ``prefix.``; ``values``: the composed section, to show where a value differs from the
    default; ``options``: the config groups' default options, for the sections they select."""
    lines: list[str] = []
    options = options or {}
    for name, field in model.model_fields.items():
        if name == "name" and prefix:
            continue
        here = (values[name],) if values is not None and name in values else ()
        nested = field.annotation
        if (isinstance(nested, type) and issubclass(nested, BaseModel)
                and not field.is_required()):
            # its head (a config group's: its default option), then its keys
            lines += field_lines(f"{prefix}{name}", field, here, options.get(name))
            lines += model_lines(nested, f"{prefix}{name}.",
                                 here[0] if here and isinstance(here[0], Mapping) else None)
        else:
            lines += field_lines(f"{prefix}{name}", field, here, options.get(name))
    return lines


def group_defaults(conf: Path) -> dict[str, str]:
    """Each config group's option in conf/config.yaml's defaults list."""
    import yaml

    defaults = yaml.safe_load((conf / "config.yaml").read_text()).get("defaults", [])
    return {key: value for entry in defaults if isinstance(entry, dict)
            for key, value in entry.items() if "/" not in key and " " not in key}


def group_lines(conf: Path) -> list[str]:
    """'  strategy (default fedavg): dcfl, fedavg, ...' for every config group."""
    defaults = group_defaults(conf)
    lines = ["config groups (choose an option with GROUP=OPTION; its settings: "
             "driftfl run --help GROUP=OPTION):"]
    for group in sorted(p.name for p in conf.iterdir() if p.is_dir()):
        options = sorted(p.stem for p in (conf / group).glob("*.yaml"))
        default = (f" (default {defaults[group]})" if group in defaults
                   else f" (none by default; add one: +{group}=OPTION)")
        lines += textwrap.wrap(f"{group}{default}: {', '.join(options)}", WIDTH,
                               initial_indent="  ", subsequent_indent="      ")
    return lines


def general_help() -> str:
    """The groups, the top-level settings and those of each group's default option: needs
    neither torch nor Flower."""
    return run_help([])


def option_lines(overrides: list[str], data: Mapping[str, Any]) -> list[str]:
    """The settings of the option each section a registry checks uses (strategy=fedavg,
    partition=dirichlet, ...), the one the overrides choose or else the default, from the
    schema that checks it: `partition.alpha` is listed though a run need not name `partition`.
    Built-in options need neither torch nor Flower (their declarations are torch-free)."""
    from driftfl.common.experiment_settings import ExperimentSettings
    from driftfl.methods import check_experiment

    fields = ExperimentSettings.model_fields
    named = {word.split("=", 1)[0].lstrip("+~") for word in overrides if "=" in word}
    checked = check_experiment(data)
    lines = []
    for group in (g for g in fields if fields[g].is_required()):
        section = getattr(checked, group)
        if not isinstance(section, BaseModel):  # a required value (label), not a section
            continue
        chosen = "" if group in named else " (the default)"
        lines += ["", f"{group}={section.name}{chosen}: its settings (key: type = default; "
                      "here: the value these overrides give):"]
        lines += model_lines(type(section), f"{group}.", data[group]) or ["  (none)"]
    return lines


def run_help(overrides: list[str]) -> str:
    """`driftfl run --help [overrides]`: the groups and every setting, its value with these
    overrides where it differs from the default, then the settings of the options each group
    uses. ConfigError where the overrides do not compose."""
    from driftfl.common.composing import composed, conf_dir
    from driftfl.common.experiment_settings import ExperimentSettings

    data = composed(overrides)
    settings = model_lines(ExperimentSettings, values=data, options=group_defaults(conf_dir()))
    return "\n".join([HEADER, *group_lines(conf_dir()), "",
                      "settings (key: type = default, then what it means; here: the value "
                      "these overrides give):", *settings, *option_lines(overrides, data)]) + "\n"


def version_text() -> str:
    """driftfl's version and those of what it runs on, read from the installed packages'
    metadata (importing torch or Flower would take seconds)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    parts = ", ".join(f"{name} {of(name)}" for name in ("flwr", "torch", "hydra-core",
                                                          "pydantic", "ray"))
    return f"driftfl {of('driftfl')} ({parts}; Python {platform.python_version()})\n"


HELP_FLAGS = {"-h", "--help"}


def run_answer(args: list[str], read: Callable[[list[str]], list[str]],
               refuse: Callable[..., str | None]) -> str | None:
    """What `driftfl run` prints for --help or --version, driftfl's own rather than Hydra's
    (--hydra-help stays Hydra's); None for any other command line. The overrides beside
    --help (``read`` finds them) are checked as a run checks them (``refuse``: the first
    problem); ConfigError names it."""
    if "--hydra-help" in args:
        return None
    if "--version" in args:
        return version_text()
    if not HELP_FLAGS & set(args):
        return None
    overrides = [o for o in read(args) if not o.lstrip("+~").startswith("hydra")]
    if overrides and (problem := refuse(overrides, reachable=False)):
        from driftfl.common.errors import ConfigError

        raise ConfigError(problem)
    return run_help(overrides)
