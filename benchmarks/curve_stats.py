"""Shape of each run's accuracy curve, beside `driftfl report`'s final/best figures: accuracy at
round 10, mean of the last 5 rounds, worst of the last 10, largest change between two rounds.
One line per run, then one per (partition, method) with the mean ± std over its seeds.

    .venv/bin/python benchmarks/curve_stats.py results/fedssd-table [more run or sweep dirs]
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import yaml

FIGURES = ("round 10", "last 5", "worst of last 10", "largest swing")


def curve_figures(acc: list[float]) -> tuple[float, ...]:
    """`acc[0]` is the untrained model (round 0), `acc[t]` the global model after round t."""
    return (acc[10], statistics.fmean(acc[-5:]), min(acc[-10:]),
            max(abs(b - a) for a, b in zip(acc[1:], acc[2:])))


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):6.2f} ± {std:4.2f}"


def main(roots: list[str]) -> None:
    groups: dict[tuple[str, str], list[tuple[float, ...]]] = defaultdict(list)
    for metrics in sorted(p for root in roots for p in Path(root).rglob("metrics.json")):
        acc = [100 * r["test_accuracy"] for r in json.loads(metrics.read_text())["rounds"]]
        if len(acc) < 11:
            continue  # fewer than 10 trained rounds: nothing to say about the curve's tail
        cfg = yaml.safe_load((metrics.parent / "config.yaml").read_text())
        figures = curve_figures(acc)
        groups[cfg["partition"]["name"], cfg["label"]].append(figures)
        print(f"{cfg['partition']['name']:<12} {cfg['label']:<16} seed {cfg['seed']}  "
              + "  ".join(f"{name} {value:6.2f}" for name, value in zip(FIGURES, figures)))
    print("\nmean ± std over seeds")
    for (partition, label), runs in sorted(groups.items()):
        columns = [mean_std([run[i] for run in runs]) for i in range(len(FIGURES))]
        print(f"{partition:<12} {label:<16} {len(runs)} runs  "
              + "  ".join(f"{name} {column}" for name, column in zip(FIGURES, columns)))


if __name__ == "__main__":
    main(sys.argv[1:])
