"""What the e2e tests of `driftfl run` share: the quick experiment and reading a run back."""

from __future__ import annotations

import json
from pathlib import Path

QUICK = ["model=mlp", "dataset.subset=4000", "dataset.test_subset=2000", "num_clients=4",
         "rounds=2", "lr=0.05"]


def read_rounds(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "metrics.json").read_text())["rounds"]


def assert_learned(run_dir: Path, rounds: int = 2) -> list[dict]:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    rows = read_rounds(run_dir)
    assert [r["round"] for r in rows] == list(range(rounds + 1))
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.3  # from ~10 % to > 40 %
    return rows
