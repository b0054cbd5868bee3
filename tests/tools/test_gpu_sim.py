"""scripts/gpu_sim.py, the prepared check of Ray simulation on a GPU machine: its carries come
back whole, and its plan (the GPU check, four methods in Ray simulation, the floor) runs on the
CPU, so it works the first time a GPU machine is lent."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = REPO / "scripts" / "gpu_sim.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_sim", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_carries_hold_each_file_whole_or_in_parts_under_the_limit(tmp_path, monkeypatch):
    gpu_sim = load_script()
    sources = tmp_path / "sources"
    sources.mkdir()
    contents = {"big.whl": bytes(range(256)) * 10, "mid.whl": b"m" * 700, "data.gz": b"d" * 90}
    for name, content in contents.items():
        (sources / name).write_bytes(content)
    carries = gpu_sim.pack(sorted(sources.iterdir()), tmp_path / "gpu", limit=1000)
    assert len(carries) == 4  # 2,560 + 700 + 90 bytes by 1,000 at most: 3 parts of big
    for carry in carries:
        assert sum(f.stat().st_size for f in carry.iterdir()) <= 1000
    assert {f.name for c in carries for f in c.iterdir()} == {
        "big.whl.part00", "big.whl.part01", "big.whl.part02", "mid.whl", "data.gz"}
    monkeypatch.setattr(gpu_sim, "STAGE", tmp_path / "stage")
    for carry in carries:  # one device call each
        gpu_sim.stage(carry)
    gpu_sim.join_parts(gpu_sim.STAGE)
    assert {f.name: f.read_bytes() for f in gpu_sim.STAGE.iterdir()} == contents


def test_what_overhead_prints_is_read_as_the_floor_ratio():
    gpu_sim = load_script()
    printed = ("model   driftfl round  floor round  ratio    driftfl train ...\n"
               "cnn            3.10 s       2.50 s  1.24x           2.90 s ...\n")
    assert gpu_sim.floor_ratio(printed) == {"model": "cnn", "driftfl_round": 3.1,
                                            "floor_round": 2.5, "ratio": 1.24}
    assert gpu_sim.floor_ratio("driftfl run failed") == {}


@pytest.mark.slow  # three real steps: the GPU check, the main job, the overhead benchmark
def test_the_plan_runs_on_the_cpu(tmp_path, fmnist_available, simulation_host):
    """The plan's steps run as written; --quick runs the main job alone of the four methods'
    `driftfl run`s (the others differ only in their overrides, which
    tests/e2e/test_e2e_every_method.py runs)."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(SCRIPT), "check", "--device", "cpu", "--quick",
                           "--out", str(out)], env=simulation_host, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "gpu-sim.json").read_text())
    steps = {s["step"]: s for s in report["steps"]}
    assert [s["rc"] for s in report["steps"]] == [0] * 3
    run = steps["driftfl run main job, client_gpus 0.0"]
    assert run["status"] == "completed" and run["seconds_per_round"] > 0
    assert 0.1 < run["final_accuracy"] <= 1
    floor = steps["overhead against the floor"]
    assert floor["model"] == "mlp" and floor["ratio"] > 0
    assert "3 of 3 steps passed" in done.stdout
    assert (out / "gpu-sim.log").read_text().count("=====") == 3
