"""A real run whose every client runs out of memory ends clearly: one line a round naming the
resource and the setting to change, none of Ray's report, and after max_rounds_without_reply
rounds in a row a stop with status failed and one line."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import driftfl_bin

pytestmark = pytest.mark.e2e


def test_a_run_out_of_memory_every_round_stops_failed_in_a_few_lines(tmp_path,
                                                                      fmnist_available):
    run_dir = tmp_path / "run"
    # Ray's memory monitor kills a worker once the node uses more than this share of its
    # memory: at 1 %, every client of every round, as on a machine truly out of memory
    env = {**os.environ, "RAY_memory_usage_threshold": "0.01"}
    out = subprocess.run([driftfl_bin(), "run", "model=mlp", "dataset.subset=2000",
                          "dataset.test_subset=500", "num_clients=2", "rounds=3",
                          "max_rounds_without_reply=2", f"hydra.run.dir={run_dir}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    console = out.stdout + out.stderr
    assert out.returncode == 1, console[-5000:]
    failed = [line for line in console.splitlines() if "failed: out of memory" in line]
    assert len(failed) == 2, console[-5000:]  # one line a round, for both clients
    assert failed[0].endswith("round replies of 2 client(s) (partition 0, partition 1) failed: "
                              "out of memory; run fewer clients at once (a larger "
                              "simulation.client_cpus), or a smaller batch_size or model; "
                              "under device=cuda, a larger simulation.client_gpus")
    assert "Top 10 memory users" not in console and "Traceback" not in console
    assert len(console) < 4000, console  # the table, three round lines, the stop: no kilobytes
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["reason"].startswith(
        "stopped after round 2: rounds 1-2 got no usable client reply "
        "(max_rounds_without_reply=2); the clients' error: out of memory; run fewer clients")
    assert f"driftfl: error: {summary['reason']}" in console.splitlines()
    assert console.splitlines()[-1] == \
        f"driftfl: the run failed; its summary.json and rounds are in {run_dir}"
    rows = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    assert [(r["round"], r["clients"], r["rejected"]) for r in rows] == [(0, 0, 0), (1, 0, 2),
                                                                          (2, 0, 2)]
