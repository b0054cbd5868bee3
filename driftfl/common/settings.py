"""Typed settings: every part of an experiment declares its settings once, as a pydantic model.

A model's fields are the one place a setting's type, default, range (``Field(ge=..., lt=...)``)
and choices (``Literal[...]``) live; validation is strict (no text read as a number, no
``true`` read as 1) and refuses unknown keys. ``validated`` turns pydantic's report into one
line that names the key, the value and what is allowed, e.g.

    strategy.tau must be > 0, got 0
    unknown strategy.mask 'soft'; valid: adaptive, forcible, off
    unknown setting strategy.muu; did you mean strategy.mu?

Why pydantic rather than Hydra's structured configs: OmegaConf checks types and Enum choices but
has no ranges and no checks across fields, which would have to be written again by hand;
pydantic declares all of them in the field itself, and Hydra still composes the YAML.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import annotated_types as at
from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import ConfigError, lookup

# the largest count a setting may take (rounds, clients, epochs, batch and sample sizes, widths):
# far past any real experiment, and a typo's 20 digits is refused instead of run
MANY = 1_000_000

# an experiment's settings that change how a run is carried out, not what it computes (a
# simulated client's cores do: they are its torch threads); a resume and a report row ignore them
OPERATIONAL = frozenset({"verbose", "tracker", "node_wait", "round_timeout",
                         "max_rounds_without_reply", "min_clients",
                         "rejoin_wait", "simulation.ray_address", "simulation.client_gpus",
                         "superlink"})

S = TypeVar("S", bound="Settings")


class Settings(BaseModel):
    """Strict, closed and immutable settings."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    def for_classes(self, num_classes: int) -> Settings:
        """These settings with defaults that follow the dataset's class count filled in."""
        return self


class NoSettings(Settings):
    """A part without settings of its own."""


class Named(Settings):
    """Settings of a section that names its kind (``name: fedcsd``)."""

    name: str


def changed(settings: Settings) -> list[str]:
    """The settings of a named section (all but ``name``) that differ from their defaults."""
    fields = type(settings).model_fields
    return [key for key, field in fields.items()
            if key != "name" and getattr(settings, key) != field.default]


def validated(cls: type[S], data: Mapping[str, Any], prefix: str = "") -> S:
    """``cls`` built from ``data``, or a ConfigError whose one line names the first problem;
    ``prefix`` is where ``data`` sits in the experiment (e.g. ``strategy.``)."""
    try:
        return cls.model_validate(dict(data))
    except ValidationError as err:
        raise ConfigError(describe(err.errors()[0], cls, prefix)) from None


def nearest(name: str, valid: Iterable[str]) -> str | None:
    """The valid name a mistyped one most likely meant (None when none is close)."""
    found = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_key(key: str, valid: Iterable[str], prefix: str = "") -> str:
    """'unknown setting strategy.muu; did you mean strategy.mu?' (or the valid keys)."""
    valid = sorted(valid)
    guess = nearest(key, valid)
    hint = (f"did you mean {prefix}{guess}?" if guess
            else f"valid: {', '.join(prefix + name for name in valid)}")
    return f"unknown setting {prefix}{key}; {hint}"


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"  # a whole bound in full


def bounds_text(metadata: Iterable) -> str | None:
    """'> 0', '>= 1', 'in (0, 1]', ... from a field's annotated-types constraints."""
    low = high = None
    for item in metadata:
        if isinstance(item, at.Gt):
            low = ("(", item.gt)
        elif isinstance(item, at.Ge):
            low = ("[", item.ge)
        elif isinstance(item, at.Lt):
            high = (")", item.lt)
        elif isinstance(item, at.Le):
            high = ("]", item.le)
    if low and high:
        return f"in {low[0]}{_number(low[1])}, {_number(high[1])}{high[0]}"
    if low:
        return f"{'>' if low[0] == '(' else '>='} {_number(low[1])}"
    if high:
        return f"{'<' if high[0] == ')' else '<='} {_number(high[1])}"
    return None


# a violated bound as its annotated-types constraint, for fields whose metadata is not at hand
_BOUND_ERRORS = {"greater_than": lambda c: at.Gt(c["gt"]),
                 "greater_than_equal": lambda c: at.Ge(c["ge"]),
                 "less_than": lambda c: at.Lt(c["lt"]),
                 "less_than_equal": lambda c: at.Le(c["le"])}


def _model_at(cls: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The settings model at ``loc`` inside ``cls`` (None where ``loc`` leads elsewhere)."""
    model = cls
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)
                and part in model.model_fields):
            return None
        model = model.model_fields[part].annotation
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _field_metadata(cls: type[BaseModel], loc: tuple) -> list:
    """The constraints of the field at ``loc``, [] if not found."""
    parent = _model_at(cls, loc[:-1])
    info = parent.model_fields.get(loc[-1]) if parent and loc else None
    return list(info.metadata) if info else []


def describe(error: Mapping, cls: type[BaseModel], prefix: str = "") -> str:
    """One pydantic error as one line for a person."""
    loc = tuple(error["loc"])
    key = prefix + ".".join(str(p) for p in loc)
    value, kind, ctx = error.get("input"), error["type"], error.get("ctx") or {}
    if kind == "extra_forbidden":
        parent = _model_at(cls, loc[:-1])
        scope = prefix + "".join(f"{p}." for p in loc[:-1])
        return unknown_key(str(loc[-1]), parent.model_fields if parent else (), scope)
    if kind == "missing":
        return f"missing required setting {key}"
    if kind == "literal_error":
        valid = sorted(v.strip("'") for v in ctx["expected"].replace(" or ", ", ").split(", "))
        return f"unknown {key} {value!r}; valid: {', '.join(valid)}"
    if kind in _BOUND_ERRORS:
        bounds = bounds_text(_field_metadata(cls, loc)) or bounds_text([_BOUND_ERRORS[kind](ctx)])
        return f"{key} must be {bounds}, got {value!r}"
    if kind.startswith("int_"):
        return f"{key} must be a whole number, got {value!r}"
    if kind == "finite_number":
        return f"{key} must be a finite number, got {value!r}"
    if kind.startswith("float_"):
        return f"{key} must be a number, got {value!r}"
    if kind.startswith("bool_"):
        return f"{key} must be true or false, got {value!r}"
    if kind.startswith("string_"):
        return f"{key} must be text, got {value!r}"
    if kind in ("list_type", "tuple_type"):
        return f"{key} must be a list, got {value!r}"
    if kind == "value_error":  # a validator's own sentence, about its field or its section
        if loc and not isinstance(value, Mapping):
            return f"{key} {ctx['error']}, got {value!r}"
        return f"{prefix}{ctx['error']}" if not loc else ctx["error"]  # a section's own check
    return f"{key}: {error['msg']}, got {value!r}"


def section(kind: str, data: Mapping[str, Any] | Settings,
            table: Mapping[str, type[S]]) -> S:
    """The settings of a section whose schema depends on its ``name`` (a dataset, a model, ...),
    from the ``table`` of schemas by name; settings already built pass through."""
    if isinstance(data, Settings):
        return data
    return validated(lookup(kind, data.get("name"), table), data, f"{kind}.")


class StrategySettings(Settings):
    """A strategy's own settings: the server's half of a method's ``strategy`` section."""

    def aux_set_per_class(self) -> int:
        """Training samples per class the server keeps back as its aux set (0: none)."""
        return 0
