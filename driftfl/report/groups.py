"""What the report's tables share: a row of runs (``Group``) and a mean +- std cell."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .runs import Run


@dataclass
class Group:
    """One row: runs with the same ``--by`` values (``key``) and the same experiment apart from
    the seed. ``split`` holds the settings that tell it from the other rows under its ``key``."""

    key: tuple[str, ...]
    split: dict[str, str]
    runs: list[Run]

    @property
    def name(self) -> tuple[str, ...]:
        """``key``, its last value followed by the splitting settings, e.g. fedavg (rounds=2)."""
        if not self.split:
            return self.key
        return (*self.key[:-1],
                f"{self.key[-1]} ({', '.join(f'{k}={v}' for k, v in self.split.items())})")

    @property
    def title(self) -> str:
        return " / ".join(self.name)


def mean_std(values: list[float], scale: float = 100.0) -> str:
    """``mean ± std``; one value has no spread: ``mean ± -``."""
    if not values:
        return "-"
    mean = statistics.fmean(values) * scale
    if len(values) == 1:
        return f"{mean:.2f} ± -"
    return f"{mean:.2f} ± {statistics.stdev(values) * scale:.2f}"
