"""Shape of each run's accuracy curve, beside `driftfl report`'s final/best figures: accuracy at
round 10, mean of the last 5 rounds, worst of the last 10, largest change between two rounds.
One line per run, then one per (partition, method) with the mean ± std over its seeds.

    .venv/bin/python benchmarks/curve_stats.py results/fedssd-table [more run or sweep dirs]
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from driftfl.report import find_runs, mean_std

FIGURES = ("round 10", "last 5", "worst of last 10", "largest swing")


def curve_figures(acc: list[float]) -> tuple[float, ...]:
    """`acc[0]` is the untrained model (round 0), `acc[t]` the global model after round t."""
    return (acc[10], statistics.fmean(acc[-5:]), min(acc[-10:]),
            max(abs(b - a) for a, b in zip(acc[1:], acc[2:])))


def main(roots: list[str]) -> None:
    groups: dict[tuple[str, str], list[tuple[float, ...]]] = defaultdict(list)
    runs, _ = find_runs([Path(root) for root in roots])  # completed runs only
    for run in runs:
        if len(run.accuracy) < 11:
            continue  # fewer than 10 trained rounds: nothing to say about the curve's tail
        partition, label = run.value("partition.name"), run.value("label")
        figures = curve_figures(run.accuracy)
        groups[partition, label].append(figures)
        print(f"{partition:<12} {label:<16} seed {run.value('seed')}  "
              + "  ".join(f"{name} {100 * value:6.2f}" for name, value in zip(FIGURES, figures)))
    print("\nmean ± std over seeds")
    for (partition, label), group in sorted(groups.items()):
        columns = [mean_std([run[i] for run in group]) for i in range(len(FIGURES))]
        print(f"{partition:<12} {label:<16} {len(group)} runs  "
              + "  ".join(f"{name} {column}" for name, column in zip(FIGURES, columns)))


if __name__ == "__main__":
    main(sys.argv[1:])
