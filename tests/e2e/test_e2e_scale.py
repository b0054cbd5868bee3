"""Many simulated clients, a Ray cluster of its own, and metrics streamed to TensorBoard: real
`driftfl run`s on real Fashion-MNIST."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import driftfl_bin
from driftfl.common.datasets import load_dataset
from driftfl.common.partition import label_histogram, partition
from driftfl.host import free_port, stop
from support.runs import QUICK, assert_learned

pytestmark = pytest.mark.e2e


def csv_rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


def tensorboard_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """What a TensorBoard reader finds in the run's event files: tag -> {round: value}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)}
            for tag in events.Tags()["scalars"]}


@pytest.mark.timeout(1200)  # about 2 minutes on a quiet 2-core machine
def test_two_thousand_clients_train_and_stream_their_rounds_to_tensorboard(
        tmp_path, fmnist_available, simulation_host):
    run_dir = tmp_path / "run"
    out = subprocess.run([driftfl_bin(), "run", "num_clients=2000", "fraction=0.005",
                          "partition=iid", "model=mlp", "rounds=2", "local_epochs=5",
                          "dataset.test_subset=2000",
                          "tracker=tensorboard", f"hydra.run.dir={run_dir}"],
                         cwd=tmp_path, env=simulation_host, capture_output=True, text=True,
                         timeout=1100)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "data survey" not in out.stdout  # in simulation the server assigns the partitions
    # the table stays short: 20 clients, then a summary of all 2000
    assert "1980 more clients in partition.json" in out.stdout
    assert "samples per client: min 30, median 30, max 30" in out.stdout
    rows = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert [r["clients"] for r in rows] == [0, 10, 10] and rows[1]["num_examples"] == 300
    assert rows[2]["test_accuracy"] > rows[0]["test_accuracy"] + 0.2  # 300 images a round

    # the histograms the server took from the partitioning are each client's exact data, and
    # the clients trained on them: the examples they report are their partitions' sizes
    clients = json.loads((run_dir / "partition.json").read_text())["clients"]
    assert [c["partition_id"] for c in clients] == list(range(2000))
    assert len({c["node_id"] for c in clients}) == 2000
    labels = load_dataset({"name": "fmnist"}).train_y
    parts = partition(labels, {"name": "iid"}, 2000, 0)
    assert [c["label_histogram"] for c in clients] == [label_histogram(labels[p], 10)
                                                       for p in parts]

    # TensorBoard holds every numeric column of metrics.csv, round by round
    scalars = tensorboard_scalars(run_dir)
    table = csv_rows(run_dir)
    for column in ("test_accuracy", "test_loss", "train_loss", "seconds", "bytes_sent",
                   "acc_class_0", "acc_class_9", "clients"):
        expected = {int(r["round"]): float(r[column]) for r in table if r[column] != ""}
        assert scalars[column].keys() == expected.keys(), column
        assert np.allclose([scalars[column][k] for k in expected], list(expected.values()),
                           rtol=1e-6), column  # event files hold float32


@pytest.fixture
def ray_cluster():
    """A Ray head started as its own process on 127.0.0.1, as `ray start --head` on a machine
    of a cluster; stopped (with everything under it) after the test."""
    port = free_port()
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # Ray's socket paths must stay short
    ray = str(Path(sys.executable).parent / "ray")
    head = subprocess.Popen(
        [ray, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
         "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats", "--block",
         f"--temp-dir={temp}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while subprocess.run([ray, "status", f"--address=127.0.0.1:{port}"],
                             capture_output=True).returncode:
            assert head.poll() is None, head.stdout.read()
            assert time.monotonic() < deadline, "the Ray head did not come up in 180 s"
            time.sleep(2)
        yield f"127.0.0.1:{port}", head, Path(temp)
    finally:
        stop(head)
        shutil.rmtree(temp, ignore_errors=True)


def test_a_run_attached_to_a_ray_cluster_trains_on_it(tmp_path, fmnist_available, ray_cluster):
    address, head, temp = ray_cluster
    run_dir = tmp_path / "run"
    out = subprocess.run([driftfl_bin(), "run", *QUICK, f"simulation.ray_address={address}",
                          f"hydra.run.dir={run_dir}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert_learned(run_dir)
    # the clients ran on the cluster's workers: its head still runs, and the run's Ray driver
    # joined it rather than starting an instance of its own
    assert head.poll() is None
    logs = temp / "session_latest" / "logs"
    assert any(p.name.startswith("python-core-driver-") for p in logs.iterdir())
    # each worker of the cluster writes the class of the actor it hosts at the head of its own
    # stdout file (read from disk: the copy forwarded to the driver's stdout can lag under load)
    hosts = [p.name for p in logs.glob("worker-*.out")
             if ":actor_name:ClientAppActor" in p.read_text(errors="replace")]
    assert hosts, sorted(p.name for p in logs.iterdir())
