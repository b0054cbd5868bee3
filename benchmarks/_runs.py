"""What the benchmarks share: run driftfl for real and read back its per-round metrics."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def driftfl_rounds(overrides: list[str]) -> list[dict]:
    """The trained rounds (1..R) of a `driftfl run` with these overrides."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        driftfl = Path(sys.executable).parent / "driftfl"
        out = subprocess.run([str(driftfl), "run", *overrides, f"hydra.run.dir={run_dir}"],
                             cwd=tmp, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"driftfl run failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        rows = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    return [r for r in rows if r["round"] > 0]


def steady(rows: list[dict], key: str) -> float:
    """Median over rounds 2..R: round 1 holds Ray's start and the first data load."""
    return statistics.median(r[key] for r in rows[1:])
