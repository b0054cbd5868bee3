"""One error type for bad input, so every entry point can show it as one clear line."""

from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """Bad input from the user: a wrong name, a value out of range, missing data."""


def lookup(kind: str, name: str, table: Mapping[str, T]) -> T:
    """``table[name]``, or a ConfigError that lists the valid names."""
    if not isinstance(name, str) or name not in table:
        raise ConfigError(f"unknown {kind} '{name}'; valid: {', '.join(sorted(table))}")
    return table[name]
