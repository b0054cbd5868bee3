"""Real deployment on 127.0.0.1: a SuperLink and two SuperNodes as separate processes, started
with the README's commands. One node reads a partition of Fashion-MNIST, the other only its own
.npz file. Every process the test starts is stopped."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from driftfl.common.datasets import load_dataset
from driftfl.launch import _tool, _wait_healthy, flwr_env, free_port, stop

pytestmark = pytest.mark.e2e


def start(cmd, env, log_path):
    with open(log_path, "w") as log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def test_superlink_and_two_supernodes_train_two_rounds(tmp_path, fmnist_available):
    # the second data owner's own file: 1500 Fashion-MNIST images no partition contains
    data = load_dataset({"name": "fmnist"})
    own = tmp_path / "owner-b.npz"
    np.savez(own, x=data.train_x[10000:11500, 0], y=data.train_y[10000:11500])

    processes = []
    with tempfile.TemporaryDirectory() as flwr_home:
        port = free_port()
        (Path(flwr_home) / "config.toml").write_text(
            f'[superlink.deployment]\naddress = "127.0.0.1:{port}"\ninsecure = true\n')
        env = flwr_env(flwr_home)
        try:
            superlink_log = tmp_path / "superlink.log"
            processes.append(start(
                [_tool("flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port",
                 str(port), "--disable-runtime-dependency-installation"], env, superlink_log))
            _wait_healthy(port, processes[0], superlink_log)
            for i, node_config in enumerate(["partition-id=0 num-partitions=2",
                                             f"data-dir='{own}'"]):
                processes.append(start(
                    [_tool("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{port}",
                     "--port", str(free_port()), "--node-config", node_config],
                    env, tmp_path / f"supernode{i}.log"))
            run_dir = tmp_path / "run"
            overrides = ("model=mlp dataset.subset=4000 dataset.test_subset=2000 num_clients=2 "
                         "rounds=2 node_wait=120")
            started = time.monotonic()
            out = subprocess.run(
                [_tool("flwr"), "run", str(REPO), "deployment", "--stream", "--run-config",
                 f"overrides='{overrides}' run-dir='{run_dir}'"],
                env=env, capture_output=True, text=True, timeout=900)
            elapsed = time.monotonic() - started
        finally:
            for process in reversed(processes):
                stop(process)
    logs = out.stdout[-3000:] + out.stderr[-3000:] + "".join(
        p.read_text()[-2000:] for p in tmp_path.glob("*.log"))
    assert (run_dir / "summary.json").is_file(), logs
    assert all(p.poll() is not None for p in processes)  # nothing left running

    rows = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.3, rows
    assert rows[1]["clients"] == 2
    clients = json.loads((run_dir / "partition.json").read_text())["clients"]
    by_kind = {c["partition_id"]: c for c in clients}
    assert set(by_kind) == {-1, 0}  # one partition node, one own-data node
    assert by_kind[-1]["num_examples"] == 1500
    assert by_kind[-1]["label_histogram"] == np.bincount(
        data.train_y[10000:11500], minlength=10).tolist()
    print(f"deployment: 2 rounds in {elapsed:.0f} s")
