"""Real deployment on 127.0.0.1: a SuperLink and SuperNodes as separate processes, started with
the README's commands: TLS and node authentication, the nodes reaching the SuperLink only
through the fleet proxy (one test runs README's --insecure shortcut). Each node reads what its
--node-config names, a partition of Fashion-MNIST or its own file, and nothing else. Every
process a test starts is stopped."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import driftfl_bin
from driftfl.client.node import NO_DATA_NAMED
from driftfl.common.datasets import load_dataset
from driftfl.common.paths import console_script
from support.deployment import deployment

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", autouse=True)
def _nginx(nginx_installed):
    """Every test here may start the fleet proxy."""


def test_registered_nodes_train_fedcsd_and_strangers_are_refused(tmp_path, fmnist_available):
    """FedCSD (a prototype query, then training, each round) through TLS, node authentication
    and the fleet proxy. Refused, without hanging the run or being counted: a node whose key
    nobody registered, a node without TLS, and a stranger who holds the CA certificate and
    tries to register a key of its own through the nodes' door."""
    # the second data owner's own file: 1500 Fashion-MNIST images no partition contains
    data = load_dataset({"name": "fmnist"})
    own = tmp_path / "owner-b.npz"
    np.savez(own, x=data.train_x[10000:11500, 0], y=data.train_y[10000:11500])
    run_dir = tmp_path / "run"
    # the first node caps what the server may ask (the run asks less)
    first = ("dataset='fmnist' partition-id=0 num-partitions=2 max-parameters=1_000_000 "
             "max-local-epochs=1 max-batch-size=64")
    with deployment([first, f"data-dir='{own}'"], tmp_path) as run:
        strangers = {
            "unregistered": run.start([*run.node_command("node-2.key"), "--node-config",
                                       "dataset='fmnist' partition-id=1 num-partitions=2"],
                                      "unregistered"),
            "no-tls": run.start([*run.node_command(None, insecure=True), "--node-config",
                                 "dataset='fmnist' partition-id=1 num-partitions=2"], "no-tls")}
        config = Path(run.env["FLWR_HOME"]) / "config.toml"
        config.write_text(config.read_text() + (
            f'[superlink.stranger]\naddress = "127.0.0.1:{run.fleet}"\n'
            f'root-certificates = "{run.keys / "ca.crt"}"\n'))
        register = subprocess.run([driftfl_bin(), "secure", "register", "stranger",
                                   str(run.keys / "node-2.key.pub")], env=run.env,
                                  capture_output=True, text=True, timeout=120)
        out = run("strategy=fedcsd model=mlp dataset.subset=4000 dataset.test_subset=2000 "
                  "num_clients=2 rounds=2 node_wait=120", run_dir)
        listed = subprocess.run([console_script("flwr"), "supernode", "list", "deployment", "--format",
                                 "json"], env=run.env, capture_output=True, text=True,
                                timeout=120)
        exits = {name: node.wait(timeout=120) for name, node in strangers.items()}
    assert (run_dir / "summary.json").is_file(), out.stdout[-3000:] + out.stderr[-3000:]
    # deployment does not trust its clients by default, and two cannot be bounded: the run's
    # first lines say so, and what a node lying about its count weighs
    assert ("driftfl: warning: clients not trusted (trust=auto), but with 2 clients a round no "
            "bound is possible" in out.stdout and "90.9% of the mean" in out.stdout), \
        out.stdout[-3000:]

    rows = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.3, rows
    assert all(r["clients"] == 2 and r["rejected"] == 0 for r in rows[1:])
    assert 0 < rows[2]["teacher_accuracy"] < 1
    assert all(r["teacher_logits_reused"] == 1 for r in rows[1:])  # node state kept the logits
    clients = json.loads((run_dir / "partition.json").read_text())["clients"]
    by_kind = {c["partition_id"]: c for c in clients}
    assert set(by_kind) == {-1, 0}  # one partition node, one own-data node: no stranger
    assert by_kind[-1]["num_examples"] == 1500
    assert by_kind[-1]["label_histogram"] == np.bincount(
        data.train_y[10000:11500], minlength=10).tolist()

    # the refused: registration through the proxy is forbidden; the unregistered node and the
    # one without TLS gave up at once (Flower's exit code 305: no connection to the SuperLink)
    assert register.returncode == 1 and "403 Forbidden" in register.stderr, register.stderr
    assert exits == {"unregistered": 1, "no-tls": 1}, exits
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in strangers}
    assert all("Exit Code: 305" in log for log in logs.values()), logs
    assert "Failed to activate SuperNode" in logs["unregistered"]
    assert "400 Bad Request" in logs["no-tls"]
    registered = json.loads(listed.stdout)["nodes"]
    assert len(registered) == 2 and all(n["status"] == "online" for n in registered), registered
    proxy_log = (tmp_path / "proxy.log").read_text()
    assert '"POST /v1/control/register-node HTTP/1.1" 403' in proxy_log


def test_with_an_owners_file_a_node_claiming_another_keys_partition_is_refused(
        tmp_path, fmnist_available):
    """`driftfl secure register` records each key's node id and partition in owners.json.
    A third key, registered for partition 2, runs with partition 0's config (the probe's
    squatter): with owners= it is refused, and partition 0's owner trains."""
    nodes = [f"dataset='fmnist' partition-id={i} num-partitions=3" for i in range(2)]
    run_dir = tmp_path / "run"
    with deployment(nodes, tmp_path) as run:
        owners = run.keys / "owners.json"
        # node-0's key again (registered already: its id is found) and the squatter's key
        register = subprocess.run([driftfl_bin(), "secure", "register", "deployment",
                                   *(str(run.keys / f"node-{i}.key.pub") for i in (0, 2))],
                                  env=run.env, capture_output=True, text=True, timeout=120)
        run.start([*run.node_command("node-2.key"), "--node-config",
                   "dataset='fmnist' partition-id=0 num-partitions=3"], "squatter")
        out = run("model=mlp dataset.subset=3000 dataset.test_subset=1000 num_clients=3 "
                  f"rounds=1 node_wait=120 owners={owners}", run_dir)
        listed = subprocess.run([console_script("flwr"), "supernode", "list", "deployment", "--format",
                                 "json"], env=run.env, capture_output=True, text=True,
                                timeout=120)
    assert register.returncode == 0, register.stdout + register.stderr
    recorded = json.loads(owners.read_text())
    node = {entry["key"]: int(n) for n, entry in recorded.items()}
    assert sorted((e["key"], e["partition"]) for e in recorded.values()) == [
        ("node-0.key.pub", 0), ("node-1.key.pub", 1), ("node-2.key.pub", 2)]
    assert sorted(node.values()) == sorted(int(n["node-id"])
                                           for n in json.loads(listed.stdout)["nodes"])
    assert f"node-0.key.pub: already registered as node {node['node-0.key.pub']}" in \
        register.stdout, register.stdout
    # no count declared (--examples): register and the run's first lines say what a liar gets
    assert ("example counts are not declared (the owners file declares none for 3 of its 3 "
            "keys): a node may claim more examples than it holds") in register.stderr
    assert ("max_examples_ratio=10 x the survey's lower median count, 83.3% of every weighted "
            "mean among 3 nodes") in out.stdout + out.stderr
    assert (run_dir / "summary.json").is_file(), out.stdout[-3000:] + out.stderr[-3000:]
    clients = json.loads((run_dir / "partition.json").read_text())["clients"]
    assert [(c["partition_id"], c["node_id"]) for c in clients] == [
        (0, node["node-0.key.pub"]), (1, node["node-1.key.pub"])]
    rows = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    assert rows[1]["clients"] == 2 and rows[1]["model_updated"] == 1, rows
    assert (f"node {node['node-2.key.pub']} refused: claims partition 0; the owners file "
            "gives its key node-2.key.pub partition 2") in out.stdout + out.stderr


def test_nodes_that_cannot_read_their_data_stop_the_run_before_training(tmp_path,
                                                                        fmnist_available):
    """A node whose folder has no images, and one that names no data (the old way: partition
    keys only), are refused; the server learns why, but not the node's paths."""
    (tmp_path / "empty" / "0").mkdir(parents=True)
    run_dir = tmp_path / "run"
    with deployment([f"data-dir='{tmp_path / 'empty'}'", "partition-id=0 num-partitions=1"],
                    tmp_path, secure=False) as run:  # README's local shortcut: --insecure
        out = run("model=mlp dataset.test_subset=500 num_clients=2 rounds=1 node_wait=120",
                  run_dir)
    # one line names the nodes and why, and the run is marked failed without a traceback
    refusal = [line for line in out.stdout.splitlines() if "driftfl: error:" in line]
    assert len(refusal) == 1 and "nodes cannot read their data (node " in refusal[0], out.stdout
    assert "Traceback" not in out.stdout + out.stderr, out.stdout[-3000:]
    # both nodes' reasons, without their paths
    assert "no images found in <data-dir>" in refusal[0] and NO_DATA_NAMED in refusal[0]
    assert str(tmp_path / "empty") not in out.stdout + out.stderr
    assert not (run_dir / "metrics.csv").exists()  # no round was run
    # each node's own log holds its full reason
    assert f"no images found in {tmp_path / 'empty'}" in (tmp_path / "supernode0.log").read_text()
    assert NO_DATA_NAMED in (tmp_path / "supernode1.log").read_text()


def test_a_node_killed_in_round_two_is_counted_lost_and_rejoins_when_restarted(
        tmp_path, fmnist_available):
    """Three SuperNodes; one SIGKILLed in round 2 and started again. Round 2 finishes with the
    others (Flower turns the dead node's message into an error reply after missed heartbeats),
    metrics name the lost partition, and the restarted node (its key registered, so its node id
    the same) is back and trains again under its partition."""
    nodes = [f"dataset='fmnist' partition-id={i} num-partitions=3" for i in range(3)]
    run_dir = tmp_path / "run"
    output = tmp_path / "flwr-run.log"
    with deployment(nodes, tmp_path) as cluster, open(output, "w") as sink:
        run = subprocess.Popen(
            cluster.command("model=mlp dataset.subset=3000 dataset.test_subset=1000 "
                            "num_clients=3 rounds=3 node_wait=120 rejoin_wait=180", run_dir),
            env=cluster.env, stdout=sink, stderr=subprocess.STDOUT, text=True)
        node_log = tmp_path / "supernode2.log"
        killed = restarted = False
        try:
            while run.poll() is None:
                # its messages: the data survey, round 1's training, round 2's training
                if not killed and node_log.read_text().count("Received successfully") == 3:
                    cluster.kill(2)
                    killed = True
                if killed and not restarted and "round   2/3" in output.read_text():
                    cluster.start_node(2)
                    restarted = True
                time.sleep(0.2)
        finally:
            run.kill()
    out = output.read_text()
    assert killed and restarted, out[-4000:]
    assert run.returncode == 0 and (run_dir / "summary.json").is_file(), out[-4000:]
    rows = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    assert [r["clients"] for r in rows[1:]] == [3, 2, 3], out[-4000:]
    assert [r["lost_partitions"] for r in rows[1:]] == ["", "2", ""]
    assert all(r["rejected"] == 0 and r["model_updated"] == 1 for r in rows[1:])
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.3, rows
    # node authentication ties a node's id to its key: restarted, it is the same node again
    assert "lost: partition(s) 2" in out and "round 3: partition 2 is back (node" in out


