"""The accuracy-against-epsilon table of benchmarks/dp_accuracy.sh, from the runs it keeps:
one row per method and noise multiplier, mean ± std over the seeds. Unlike `driftfl report` it
counts what the noise made of the rounds: rounds that learnt nothing (no usable reply: under DP
the release is then its noise alone; or a refused aggregate) and replies the server refused (a
client whose training diverged from a noise-wrecked model sends NaN or an outsized update; under
DP it counts as a zero update in the fixed-denominator mean).

    .venv/bin/python benchmarks/dp_table.py results/dp-accuracy
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from driftfl.server.outcome import learned  # noqa: E402


def spread(values: list[float]) -> str:
    mean = 100 * statistics.fmean(values)
    return f"{mean:.2f} ± {100 * statistics.stdev(values):.2f}" if len(values) > 1 else \
        f"{mean:.2f} ± -"


def main(root: Path) -> None:
    rows: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for summary in sorted(root.glob("*/seed*/summary.json")):
        method, noise = summary.parent.parent.name.rsplit("_", 1)
        rounds = json.loads((summary.parent / "metrics.json").read_text())["rounds"]
        rows[method, noise].append({"summary": json.loads(summary.read_text()),
                                    "accuracy": [r["test_accuracy"] for r in rounds],
                                    "idle": sum(not learned(r) for r in rounds[1:]),
                                    "refused": sum(r.get("rejected", 0) for r in rounds[1:]),
                                    "replies": sum(r.get("rejected", 0) + r.get("clients", 0)
                                                   for r in rounds[1:])})
    print("| method | noise multiplier | epsilon (delta 1e-5) | runs | final acc (%) | "
          "last 5 rounds (%) | best (%) | rounds that learnt nothing | replies refused |")
    print("|---|---|---|---|---|---|---|---|---|")
    order = {"none": -1.0}
    for (method, noise), runs in sorted(rows.items(), key=lambda kv: (
            kv[0][0], order.get(kv[0][1], float(kv[0][1]) if kv[0][1] != "none" else -1))):
        epsilon = runs[0]["summary"].get("epsilon")
        print(f"| {method} | {'no DP' if noise == 'none' else noise} | "
              f"{'-' if epsilon is None else f'{epsilon:.3g}'} | {len(runs)} | "
              f"{spread([r['accuracy'][-1] for r in runs])} | "
              f"{spread([statistics.fmean(r['accuracy'][-5:]) for r in runs])} | "
              f"{spread([max(r['accuracy']) for r in runs])} | "
              f"{sum(r['idle'] for r in runs)} of {sum(len(r['accuracy']) - 1 for r in runs)} | "
              f"{refused_share(runs)} |")


def refused_share(runs: list[dict]) -> str:
    replies = sum(r["replies"] for r in runs)
    return f"{100 * sum(r['refused'] for r in runs) / replies:.1f} %" if replies else "-"


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "results/dp-accuracy"))
