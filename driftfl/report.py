"""`driftfl report`: many run directories -> a mean +- std table and accuracy-versus-round plot.

    driftfl report multirun/2026-11-22/10-00-00 [more dirs] [--by label] [--target fedavg]

Runs are grouped by config keys (``--by``, default ``label``, which experiments set); each group
gets the mean +- std over its runs (seeds) of the final and best test accuracy, the rounds its
runs took to first reach the mean final accuracy of its target group, time per round and bytes
per client per round; ``--metrics`` adds the mean over trained rounds and runs of any per-round
diagnostic (logit_shift, mask_filter_rate, teacher_accuracy, ...). The target group
(``--target``, e.g. fedavg) is the one that differs only in the last ``--by`` key: with
``--by partition.name,label`` each partition races to its own FedAvg. Writes report.md,
report.csv and report.png beside printing the table.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass
class Run:
    path: Path
    config: dict
    rounds: list[dict]

    def value(self, key: str):
        node = self.config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    @property
    def accuracy(self) -> list[float]:
        return [r["test_accuracy"] for r in self.rounds]

    def rounds_to_reach(self, target: float) -> int | None:
        return next((r["round"] for r in self.rounds if r["test_accuracy"] >= target), None)


def find_runs(paths: list[Path]) -> tuple[list[Run], list[Path]]:
    """Completed runs under ``paths``, and the run directories that did not complete. A run
    whose files cannot be read (a truncated metrics.json) is left out with a warning."""
    runs, unfinished = [], []
    for root in paths:
        for metrics in sorted(Path(root).rglob("metrics.json")):
            folder = metrics.parent
            try:
                summary = folder / "summary.json"
                if not summary.is_file() or _read(summary, json.loads).get("status") != "completed":
                    unfinished.append(folder)
                    continue
                runs.append(Run(folder, _read(folder / "config.yaml", yaml.safe_load),
                                _rounds(_read(metrics, json.loads))))
            except ValueError as err:
                print(f"driftfl report: warning: skipping {folder}: {err}", file=sys.stderr)
    return runs, unfinished


def _read(path: Path, parse):
    """``path`` parsed into a mapping; ValueError names the file and what is wrong with it."""
    try:
        data = parse(path.read_text())
    except (OSError, ValueError, yaml.YAMLError) as err:
        raise ValueError(f"cannot read {path.name} ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} holds no mapping")
    return data


def _rounds(metrics: dict) -> list[dict]:
    rounds = metrics.get("rounds")
    if not (isinstance(rounds, list) and rounds and all(
            isinstance(r, dict) and isinstance(r.get("test_accuracy"), (int, float))
            for r in rounds)):
        raise ValueError("metrics.json has no rounds with a test_accuracy")
    return rounds


def mean_std(values: list[float], scale: float = 100.0) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values) * scale
    std = statistics.stdev(values) * scale if len(values) > 1 else 0.0
    return f"{mean:.2f} ± {std:.2f}"


def round_mean(trained: list[dict], metric: str) -> str:
    """Mean of a per-round diagnostic over the trained rounds that record it."""
    values = [row[metric] for row in trained if isinstance(row.get(metric), (int, float))]
    return f"{statistics.fmean(values):.3f}" if values else "-"


def summarise(runs: list[Run], by: list[str], target: str | None,
              metrics: tuple[str, ...] = ()) -> tuple[list[str], list[list]]:
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        groups.setdefault(tuple(str(run.value(k)) for k in by), []).append(run)
    def goal_of(key: tuple) -> float | None:
        reference = groups.get((*key[:-1], target)) if target is not None else None
        return statistics.fmean(r.accuracy[-1] for r in reference) if reference else None

    header = [*by, "runs", "rounds", "final acc (%)", "best acc (%)",
              f"rounds to {target}'s final acc" if target else "rounds to target",
              "s / round", "MB / client / round (down, up)", *(f"mean {m}" for m in metrics)]
    rows = []
    for key, members in sorted(groups.items()):
        goal = goal_of(key)
        reached = [r.rounds_to_reach(goal) for r in members] if goal else []
        hit = [n for n in reached if n is not None]
        trained = [row for r in members for row in r.rounds if row["round"] > 0]
        down = statistics.fmean(row["bytes_sent"] / max(row["clients"], 1) for row in trained)
        up = statistics.fmean(row["bytes_received"] / max(row["clients"], 1) for row in trained)
        rows.append([*key, len(members), max(len(r.rounds) - 1 for r in members),
                     mean_std([r.accuracy[-1] for r in members]),
                     mean_std([max(r.accuracy) for r in members]),
                     (f"{statistics.fmean(hit):.1f}" + ("" if len(hit) == len(members)
                                                        else f" ({len(hit)} of {len(members)})"))
                     if hit else ("never" if goal else "-"),
                     f"{statistics.fmean(row['seconds'] for row in trained):.1f}",
                     f"{down / 2**20:.2f}, {up / 2**20:.2f}",
                     *(round_mean(trained, m) for m in metrics)])
    return header, rows


def markdown(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def plot(runs: list[Run], by: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    groups: dict[str, list[list[float]]] = {}
    for run in runs:
        groups.setdefault(" / ".join(str(run.value(k)) for k in by), []).append(run.accuracy)
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (name, curves) in enumerate(sorted(groups.items())):
        length = min(len(c) for c in curves)
        acc = 100 * np.array([c[:length] for c in curves])
        mean, std = acc.mean(axis=0), acc.std(axis=0)
        # ten colours, then the same colours dashed, so that no two groups look alike
        ax.plot(range(length), mean, label=f"{name} (n={len(curves)})",
                linestyle=("-", "--", ":")[i // 10 % 3])
        ax.fill_between(range(length), mean - std, mean + std, alpha=0.15)
    ax.set(xlabel="round", ylabel="test accuracy (%)", title="mean ± std over runs")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    # beside the axes, not on them: with a dozen groups an inside legend hides the curves' tails
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="driftfl report", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run or sweep directories")
    parser.add_argument("--by", default="label",
                        help="comma-separated config keys to group by (default: label)")
    parser.add_argument("--target", default=None,
                        help="a group whose mean final accuracy the others race to, e.g. fedavg")
    parser.add_argument("--only", default=None,
                        help="comma-separated values of the last --by key to keep, e.g. "
                             "fedavg,fedcsd")
    parser.add_argument("--metrics", default="",
                        help="comma-separated per-round diagnostics to average, e.g. "
                             "logit_shift,mask_filter_rate")
    parser.add_argument("--out", type=Path, default=None,
                        help="where report.md/.csv/.png go (default: the first path)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        sys.exit(f"driftfl report: error: no such directory: {', '.join(missing)}")
    runs, unfinished = find_runs(args.paths)
    if not runs:
        sys.exit(f"driftfl report: error: no completed run (metrics.json + summary.json) under "
                 f"{', '.join(str(p) for p in args.paths)}")
    by = [k.strip() for k in args.by.split(",") if k.strip()]
    if args.only:
        keep = {v.strip() for v in args.only.split(",")}
        runs = [r for r in runs if str(r.value(by[-1])) in keep]
    metrics = tuple(m.strip() for m in args.metrics.split(",") if m.strip())
    recorded = {k for r in runs for row in r.rounds for k, v in row.items()
                if isinstance(v, (int, float))}
    if unknown := [m for m in metrics if m not in recorded]:
        sys.exit(f"driftfl report: error: no run records {', '.join(unknown)}; the runs record "
                 f"{', '.join(sorted(recorded))}")
    header, rows = summarise(runs, by, args.target, metrics)
    table = markdown(header, rows)
    out = args.out or args.paths[0]
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(table + "\n")
    with open(out / "report.csv", "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    plot(runs, by, out / "report.png")
    print(table)
    if unfinished:
        print(f"\n{len(unfinished)} run(s) did not complete and are left out: "
              + ", ".join(str(p) for p in unfinished[:5]))
    print(f"\nwritten: {out / 'report.md'}, report.csv, report.png")
