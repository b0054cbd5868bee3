"""Completed run directories read back: the experiment (config.yaml) and its rounds (metrics.json).
Everything in them is checked before use: a file may be cut off, edited or written by another
version."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from driftfl.common.settings import OPERATIONAL
from driftfl.common.untrusted import UnsafeFile, read_text

# settings in which the runs of one row may differ: the seed (a row averages over it) and those
# that change how a run is carried out, not what it computes (where Ray ran its clients, the
# device, the evaluation batch, whether the data was fetched; not dataset.root: for a user's
# own data it names the data)
NOT_COMPARED = OPERATIONAL | {"seed", "simulation", "device", "eval_batch_size", "dataset.download"}


@dataclass
class Run:
    path: Path
    config: dict
    rounds: list[dict]
    startup: float | None = None  # seconds of its start-up (summary.json; older runs: None)
    settings: dict[str, str] = field(init=False)  # dotted key -> value as text, compared ones

    def __post_init__(self) -> None:
        self.settings = {key: value for key, value in flatten(self.config).items()
                         if compared(key)}

    def value(self, key: str):
        node = self.config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    @property
    def accuracy(self) -> list[float]:
        return [r["test_accuracy"] for r in self.rounds]

    @property
    def trained(self) -> list[dict]:
        """The rounds after round 0 (the initial model)."""
        return [r for r in self.rounds if r["round"] > 0]

    @property
    def last_round(self) -> int:
        return max(r["round"] for r in self.rounds)

    def rounds_to_reach(self, target: float) -> int | None:
        return next((r["round"] for r in self.rounds if r["test_accuracy"] >= target), None)


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """``config`` as dotted keys, each value as text (a string as it is, anything else as JSON)."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value)
    return flat


def compared(key: str) -> bool:
    """Whether runs in one row must agree on ``key`` (``simulation`` covers simulation.*)."""
    parts = key.split(".")
    return not any(".".join(parts[:i]) in NOT_COMPARED for i in range(1, len(parts) + 1))


def find_runs(paths: list[Path]) -> tuple[list[Run], list[Path]]:
    """Completed runs under ``paths``, and the run directories that did not complete. A run
    whose files cannot be read (a truncated metrics.json), or that has no trained round, is
    left out with a warning."""
    runs, unfinished = [], []
    for root in paths:
        for metrics in sorted(Path(root).rglob("metrics.json")):
            folder = metrics.parent
            try:
                path = folder / "summary.json"
                summary = _read(path, json.loads) if path.is_file() or path.is_symlink() else {}
                if summary.get("status") != "completed":
                    unfinished.append(folder)
                    continue
                run = Run(folder, _read(folder / "config.yaml", yaml.safe_load),
                          _rounds(_read(metrics, json.loads)), summary.get("startup_seconds"))
                if not run.trained:
                    raise ValueError("it has no trained round (only round 0)")
                runs.append(run)
            except UnsafeFile:
                raise  # not a file a run wrote: the report refuses it (command.py)
            except ValueError as err:
                print(f"driftfl report: warning: skipping {folder}: {err}", file=sys.stderr)
    return runs, unfinished


def _read(path: Path, parse):
    """``path`` parsed into a mapping; ValueError names the file and what is wrong with it
    (where, never what: its lines are not echoed); UnsafeFile for a link, a device or a file
    larger than any run writes."""
    text = read_text(path)
    try:
        data = parse(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"cannot read {path.name} (not JSON: line {err.lineno})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        raise ValueError(f"cannot read {path.name} (not YAML"
                         + (f": line {mark.line + 1})" if mark else ")")) from None
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read {path.name} ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} holds no mapping")
    return data


def _rounds(metrics: dict) -> list[dict]:
    rounds = metrics.get("rounds")
    if not (isinstance(rounds, list) and rounds and all(
            isinstance(r, dict) and isinstance(r.get("round"), int)
            and number(r.get("test_accuracy")) for r in rounds)):
        raise ValueError("metrics.json has no rounds with a round number and a test_accuracy")
    return rounds


def number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def numbers(rows: list[dict], key: str) -> list[float]:
    """``key``'s values in the ``rows`` that record it as a number."""
    return [row[key] for row in rows if number(row.get(key))]
