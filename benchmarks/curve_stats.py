"""Shape of each run's accuracy curve, beside `driftfl report`'s final/best figures: accuracy at
round 10, mean of the last 5 rounds, worst of the last 10, largest change between two rounds.

    .venv/bin/python benchmarks/curve_stats.py results/fedssd-table [more run or sweep dirs]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import yaml


def main(roots: list[str]) -> None:
    for metrics in sorted(p for root in roots for p in Path(root).rglob("metrics.json")):
        acc = [100 * r["test_accuracy"] for r in json.loads(metrics.read_text())["rounds"]]
        if len(acc) < 11:
            continue  # fewer than 10 trained rounds: nothing to say about the curve's tail
        cfg = yaml.safe_load((metrics.parent / "config.yaml").read_text())
        print(f"{cfg['partition']['name']:<12} {cfg['label']:<16} seed {cfg['seed']}  "
              f"round 10 {acc[10]:6.2f}  last 5 {statistics.fmean(acc[-5:]):6.2f}  "
              f"worst of last 10 {min(acc[-10:]):6.2f}  "
              f"largest swing {max(abs(b - a) for a, b in zip(acc[1:], acc[2:])):6.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
