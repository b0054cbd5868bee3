"""A real client that fails inside a SecAgg+ stage of a real `driftfl run` (Ray simulation):
a dropout the round tolerates, not the end of the simulation. The failure is injected by a
test-only sitecustomize (tests/e2e/hostile) that makes the first client to reach Flower's
share-keys stage raise there, once; the product has no setting for it."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import REPO, driftfl_bin

pytestmark = pytest.mark.e2e


def test_a_client_raising_in_the_share_keys_stage_is_a_dropout_of_its_round(
        tmp_path, fmnist_available):
    run_dir = tmp_path / "run"
    env = {**os.environ, "DRIFTFL_TEST_FAIL_STAGE": "share_keys",
           "DRIFTFL_TEST_FAIL_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests" / "e2e" / "hostile"),
                                                       os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([driftfl_bin(), "run", "secagg=secaggplus", "model=mlp",
                          "dataset.subset=2000", "dataset.test_subset=500", "num_clients=3",
                          "rounds=2", f"hydra.run.dir={run_dir}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (tmp_path / "failed").is_file()  # a client did raise
    assert "An unhandled exception occurred" not in out.stdout + out.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    rows = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    first, second = rows[1], rows[2]
    # round 1: the failing client is left out, the other two are summed and released
    assert first["model_updated"] == 1 and first["clients"] == 2 and first["rejected"] == 1
    assert first["late_partitions"] == "" and first["secagg_outcome"] == ""
    assert f"partition(s) {first['rejected_partitions']}" not in out.stdout  # not late/lost
    assert second["model_updated"] == 1 and second["clients"] == 3  # it is back in round 2
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.2
    assert "SecAgg+ share_keys stage: error reply" in out.stdout + out.stderr
