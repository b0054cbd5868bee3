"""A sweep starts once: its jobs share one SuperLink and one Ray instance (driftfl.host), and
each job's run is the same, byte for byte, as a separate run of its settings. Real
`driftfl run` processes, real Flower and Ray."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import driftfl_bin

pytestmark = pytest.mark.e2e
QUICK = ["model=mlp", "dataset.subset=4000", "dataset.test_subset=2000", "num_clients=4",
         "rounds=1", "lr=0.05"]


def test_a_sweeps_jobs_share_one_start_up_and_match_separate_runs(tmp_path, fmnist_available):
    sweep_dir = tmp_path / "sweep"
    sweep = subprocess.run([driftfl_bin(), "run", "-m", *QUICK, "seed=0,1",
                            f"hydra.sweep.dir={sweep_dir}"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    alone_dir = tmp_path / "alone"
    alone = subprocess.run([driftfl_bin(), "run", *QUICK, "seed=1",
                            f"hydra.run.dir={alone_dir}"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert alone.returncode == 0, alone.stdout[-3000:] + alone.stderr[-3000:]

    # one start of Ray and the SuperLink for the two jobs, logged beside them
    lines = sweep.stdout.splitlines()
    assert lines.count("driftfl: starting Ray") == 1, sweep.stdout
    assert lines.count("driftfl: starting the SuperLink") == 1, sweep.stdout
    assert sum(line.startswith("driftfl: submitting the run") for line in lines) == 2
    assert "Ray runtime started" in (sweep_dir / "superlink.log").read_text()
    assert not (sweep_dir / "1" / "superlink.log").exists()
    # each run says where it goes first, before its start-up
    assert lines.index(f"driftfl: run directory {sweep_dir / '1'}") < max(
        i for i, line in enumerate(lines) if line.startswith("driftfl: submitting the run"))

    # the same settings give the same bytes, in a sweep or alone
    assert (sweep_dir / "1" / "model.pt").read_bytes() == (alone_dir / "model.pt").read_bytes()
    rounds = [json.loads((d / "metrics.json").read_text())["rounds"]
              for d in (sweep_dir / "1", alone_dir)]
    assert [r["test_accuracy"] for r in rounds[0]] == [r["test_accuracy"] for r in rounds[1]]
    assert (sweep_dir / "0" / "model.pt").read_bytes() != (alone_dir / "model.pt").read_bytes()
