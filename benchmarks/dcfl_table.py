"""DCFL's Table IV with what each variant discloses: accuracy, leakage, epsilon and the CKA's
range, mean ± std over the seeds of each label, from finished run directories.

    .venv/bin/python benchmarks/dcfl_table.py RUN_DIR... [--markdown]

Per label (the run's `label`): final and last-5 test accuracy (%); from `condensed_leakage` in
summary.json (what `driftfl audit` measured after the run) the share of shipped images with a
real image of their client at Pearson correlation >= 0.95 and the median nearest correlation;
under DP-DM the largest client epsilon (`condense_epsilon_client_*`); from metrics.csv the
CKA matrix's off-diagonal range after the last round and the mean `selection_tv` over the rounds.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

import yaml


def numbers(row: dict, prefix: str) -> list[float]:
    return [float(v) for k, v in row.items() if k.startswith(prefix) and v not in ("", None)]


def one_run(run: Path) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    accuracy = [100 * float(r["test_accuracy"]) for r in rows if int(r["round"]) > 0]
    leakage = summary.get("condensed_leakage", {}).get("overall", {})
    epsilons = [e for r in rows for e in numbers(r, "condense_epsilon_client_")]
    tv = [float(r["selection_tv"]) for r in rows if r.get("selection_tv")]
    last = next((r for r in reversed(rows) if r.get("cka_offdiag_min")), {})
    label = yaml.safe_load((run / "config.yaml").read_text()).get("label")
    return {"label": label or run.name, "final": accuracy[-1],
            "last5": statistics.mean(accuracy[-5:]),
            "copies": 100 * leakage["share"] if leakage else math.nan,
            "median": leakage.get("median", math.nan),
            "epsilon": max(epsilons) if epsilons else math.nan,
            "cka_min": float(last.get("cka_offdiag_min", math.nan)),
            "cka_max": float(last.get("cka_offdiag_max", math.nan)),
            "tv": statistics.mean(tv) if tv else math.nan}


def spread(values: list[float], digits: int = 2) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    by_label: dict[str, list[dict]] = defaultdict(list)
    for run in args.runs:
        if (run / "summary.json").exists():
            record = one_run(run)
            by_label[record["label"]].append(record)
    print("| variant | seeds | final | last 5 | copies (%) | median nearest r | max ε | "
          "CKA off-diagonal, last round | selection TV |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, records in by_label.items():
        get = lambda key: [r[key] for r in records]  # noqa: E731
        cka = (f"{spread(get('cka_min'))} – {spread(get('cka_max'))}"
               if not all(math.isnan(v) for v in get("cka_min")) else "-")
        print(f"| {label} | {len(records)} | {spread(get('final'))} | {spread(get('last5'))} | "
              f"{spread(get('copies'), 1)} | {spread(get('median'), 3)} | "
              f"{spread(get('epsilon'), 2)} | {cka} | {spread(get('tv'), 3)} |")


if __name__ == "__main__":
    main()
