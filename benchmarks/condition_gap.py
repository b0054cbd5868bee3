"""How each method's runs under one condition differ from the same method's runs under another
(say, 20 % dropout against none), seed by seed: the seed fixes the partition, so each pair
differs only by the condition. Prints, per method, the mean ± std over the paired seeds of the
difference (condition − baseline) in central test accuracy: final, mean of the last 5 rounds,
worst of the last 10, in points. (Per-client figures are left out: under dropout they cover
only the clients that trained in the round, so a pair would compare different clients.)

    .venv/bin/python benchmarks/condition_gap.py results/client-eval \\
        --key heterogeneity.name --baseline none --condition dropout
"""

from __future__ import annotations

import argparse
from pathlib import Path

from curve_stats import FIGURES as CURVE, curve_figures
from driftfl.report import find_runs, mean_std

# the final accuracy, then curve_stats.py's figures of the curve's tail, read as it reads them
FIGURES = {
    "final": lambda acc: acc[-1],
    **{name: (lambda acc, i=CURVE.index(name): curve_figures(acc)[i])
       for name in ("last 5", "worst of last 10")},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="+", help="run or sweep directories")
    parser.add_argument("--key", default="heterogeneity.name", help="the config key that differs")
    parser.add_argument("--baseline", default="none")
    parser.add_argument("--condition", default="dropout")
    args = parser.parse_args()
    runs, _ = find_runs([Path(root) for root in args.roots])  # completed runs only
    by = {(str(run.value(args.key)), run.value("label"), run.value("seed")): run for run in runs
          if len(run.accuracy) >= 11}  # as curve_stats.py: 10 trained rounds make a tail
    labels = sorted({label for _, label, _ in by})
    print(f"{args.condition} − {args.baseline}, in points, mean ± std over paired seeds")
    print("| method | seeds | " + " | ".join(FIGURES) + " |")
    print("|---|---|" + "---|" * len(FIGURES))
    for label in labels:
        seeds = sorted(seed for key, name, seed in by if name == label and key == args.baseline
                       and (args.condition, label, seed) in by)
        if not seeds:
            continue
        cells = []
        for figure in FIGURES.values():
            gaps = [figure(by[args.condition, label, seed].accuracy)
                    - figure(by[args.baseline, label, seed].accuracy) for seed in seeds]
            cells.append(mean_std(gaps))
        print(f"| {label} | {len(seeds)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
