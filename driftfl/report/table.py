"""Runs into rows: one row per ``--by`` value and experiment, mean ± std over its runs (seeds)."""

from __future__ import annotations

import statistics
from collections import defaultdict

from . import clients
from .groups import Group, mean_std
from .runs import Run, number, numbers

UNSET = "unset"  # a setting a run's config.yaml does not have (written by another version)


def group_runs(runs: list[Run], by: list[str]) -> list[Group]:
    """Runs grouped by their ``by`` values; where those of one group differ in an experiment
    setting (rounds, num_clients, ...), the group is split by the settings that differ."""
    by_key: dict[tuple[str, ...], list[Run]] = defaultdict(list)
    for run in runs:
        by_key[tuple(str(run.value(k)) for k in by)].append(run)
    groups = []
    for key, members in sorted(by_key.items()):
        keys = sorted({k for run in members for k in run.settings
                       if not any(k == b or k.startswith(f"{b}.") for b in by)})
        differ = [k for k in keys if len({run.settings.get(k, UNSET) for run in members}) > 1]
        parts: dict[tuple[str, ...], list[Run]] = defaultdict(list)
        for run in members:
            parts[tuple(run.settings.get(k, UNSET) for k in differ)].append(run)
        named = _telling(differ, list(parts))
        groups += [Group(key, {differ[i]: values[i] for i in named}, part)
                   for values, part in sorted(parts.items(), key=lambda kv: _order(kv[0]))]
    return groups


def _telling(keys: list[str], parts: list[tuple[str, ...]]) -> list[int]:
    """The few of ``keys`` (indices) that tell ``parts`` apart, a section's ``name`` first:
    where the partitions differ, partition.name says it, not every key of both schemas."""
    chosen: list[int] = []
    for i in sorted(range(len(keys)), key=lambda i: (not keys[i].endswith(".name"), keys[i])):
        told = len({tuple(p[j] for j in chosen) for p in parts})
        if told == len(parts):
            break
        if len({tuple(p[j] for j in [*chosen, i]) for p in parts}) > told:
            chosen.append(i)
    return sorted(chosen)


def _order(values: tuple[str, ...]) -> tuple:
    """Numbers by value (rounds=2 before rounds=10), then text."""
    def one(text: str) -> tuple:
        try:
            return 0, float(text), ""
        except ValueError:
            return 1, 0.0, text
    return tuple(one(v) for v in values)


def split_notes(groups: list[Group], by: list[str]) -> list[str]:
    """One line for each set of settings that split some ``--by`` values into several rows."""
    split: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for group in groups:
        title = " / ".join(group.key)
        if group.split and title not in split[tuple(group.split)]:
            split[tuple(group.split)].append(title)
    return [f"{', '.join(titles)}: the runs differ in {', '.join(keys)}, so each setting has its "
            f"own row (--by {','.join([*by[:-1], *keys, by[-1]])} makes "
            f"{'it a column' if len(keys) == 1 else 'them columns'})"
            for keys, titles in split.items()]


def _mean(values: list[float], digits: int) -> str:
    return f"{statistics.fmean(values):.{digits}f}" if values else "-"


def _of(found: int, total: int) -> str:
    return "" if found == total else f" ({found} of {total})"


def _goal(group: Group, groups: list[Group], target: str | None) -> float | None:
    """The mean final accuracy ``group`` races to: that of the ``target`` row with the same
    other ``--by`` values and, where the target's runs were split, the same settings."""
    if target is None:
        return None
    mine = group.runs[0].settings  # a row's runs agree on every compared setting
    for other in groups:
        if other.key == (*group.key[:-1], target) and all(
                mine.get(k, UNSET) == v for k, v in other.split.items()):
            return statistics.fmean(r.accuracy[-1] for r in other.runs)
    return None


def _race(group: Group, goal: float | None) -> str:
    if goal is None:
        return "-"
    hit = [n for n in (r.rounds_to_reach(goal) for r in group.runs) if n is not None]
    return f"{statistics.fmean(hit):.1f}{_of(len(hit), len(group.runs))}" if hit else "never"


def _traffic(trained: list[dict]) -> str:
    """Mean MB per client per round, down and up."""
    rows = [r for r in trained
            if all(number(r.get(k)) for k in ("bytes_sent", "bytes_received", "clients"))]
    if not rows:
        return "-"
    down = statistics.fmean(r["bytes_sent"] / max(r["clients"], 1) for r in rows)
    up = statistics.fmean(r["bytes_received"] / max(r["clients"], 1) for r in rows)
    return f"{down / 2**20:.2f}, {up / 2**20:.2f}"


def _diagnostic(group: Group, metric: str) -> str:
    """Mean of a per-round diagnostic over the trained rounds of the runs that record it."""
    per_run = [numbers(run.trained, metric) for run in group.runs]
    recording = [values for values in per_run if values]
    if not recording:
        return "-"
    pooled = [value for values in recording for value in values]
    return _mean(pooled, 3) + _of(len(recording), len(group.runs))


def _epsilon(group: Group) -> str:
    """The privacy the runs spent: epsilon after their last round (at the runs' delta), mean
    over the runs that record it; '-' without differential privacy."""
    spent = [run.trained[-1]["epsilon"] for run in group.runs
             if run.trained and number(run.trained[-1].get("epsilon"))]
    return f"{statistics.fmean(spent):.3g}{_of(len(spent), len(group.runs))}" if spent else "-"


def summarise(shown: list[Group], groups: list[Group], by: list[str], target: str | None,
              metrics: tuple[str, ...] = ()) -> tuple[list[str], list[list], list[str]]:
    """The header, a row for each of ``shown`` and notes on what is missing; ``groups`` (all
    of them, shown or not) hold the target rows."""
    header = [*by, "runs", "rounds", "final acc (%)", "best acc (%)",
              f"rounds to {target}'s final acc" if target else "rounds to target",
              "s / round from round 2", "s of start-up",
              "MB / client / round (down, up)", *(f"mean {m}" for m in metrics)]
    per_client = clients.recorded(shown)  # per-client evaluation: its columns where measured
    header += clients.header() if per_client else []
    private = any(_epsilon(group) != "-" for group in shown)
    if private:  # differential privacy: the epsilon each row's accuracy cost
        header.insert(header.index("best acc (%)") + 1, "epsilon")
    rows = []
    for group in shown:
        trained = [row for run in group.runs for row in run.trained]
        rows.append([*group.name, len(group.runs), max(r.last_round for r in group.runs),
                     mean_std([r.accuracy[-1] for r in group.runs]),
                     mean_std([max(r.accuracy) for r in group.runs]),
                     _race(group, _goal(group, groups, target)),
                     _mean(numbers([r for r in trained if r["round"] > 1], "seconds"), 1),
                     _mean([r.startup for r in group.runs if number(r.startup)], 1),
                     _traffic(trained), *(_diagnostic(group, m) for m in metrics),
                     *(clients.cells(group) if per_client else [])])
        if private:
            rows[-1].insert(header.index("epsilon"), _epsilon(group))
    notes = []
    for metric in metrics:
        lacking = [g.title for g in shown if not any(numbers(r.trained, metric) for r in g.runs)]
        if lacking:
            notes.append(f"{metric} is missing from {len(lacking)} row(s), whose runs do not "
                         f"record it: {', '.join(lacking)}")
    return header, rows, notes


def markdown(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
