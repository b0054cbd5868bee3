"""Shape of each run's accuracy curve, beside `driftfl report`'s final/best figures: accuracy at
round 10, mean of the last 5 rounds, worst of the last 10, largest change between two rounds.
One line per run, then one per group (by default: partition, method) with the mean ± std over
its seeds; `--by` names the config keys that make a group, as `driftfl report --by` does.

    .venv/bin/python benchmarks/curve_stats.py sweeps/fedssd-table [more run or sweep dirs]
    .venv/bin/python benchmarks/curve_stats.py results/client-eval --by heterogeneity.name,label
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

from driftfl.report import find_runs, mean_std

FIGURES = ("round 10", "last 5", "worst of last 10", "largest swing")


def curve_figures(acc: list[float]) -> tuple[float, ...]:
    """`acc[0]` is the untrained model (round 0), `acc[t]` the global model after round t."""
    return (acc[10], statistics.fmean(acc[-5:]), min(acc[-10:]),
            max(abs(b - a) for a, b in zip(acc[1:], acc[2:])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="+", help="run or sweep directories")
    parser.add_argument("--by", default="partition.name,label",
                        help="comma-separated config keys that make a group")
    args = parser.parse_args()
    keys = args.by.split(",")
    groups: dict[tuple[str, ...], list[tuple[float, ...]]] = defaultdict(list)
    runs, _ = find_runs([Path(root) for root in args.roots])  # completed runs only
    for run in runs:
        if len(run.accuracy) < 11:
            continue  # fewer than 10 trained rounds: nothing to say about the curve's tail
        group = tuple(str(run.value(key)) for key in keys)
        figures = curve_figures(run.accuracy)
        groups[group].append(figures)
        print("".join(f"{name:<16} " for name in group) + f"seed {run.value('seed')}  "
              + "  ".join(f"{name} {100 * value:6.2f}" for name, value in zip(FIGURES, figures)))
    print("\nmean ± std over seeds")
    for group, figures in sorted(groups.items()):
        columns = [mean_std([run[i] for run in figures]) for i in range(len(FIGURES))]
        print("".join(f"{name:<16} " for name in group) + f"{len(figures)} runs  "
              + "  ".join(f"{name} {column}" for name, column in zip(FIGURES, columns)))


if __name__ == "__main__":
    main()
