"""Real deployment on 127.0.0.1 with two SuperNodes, each holding partition i of 2, shared by
the module's tests (support.deployment: README's secure set-up, TLS, node authentication and
the fleet proxy): one deployment starts for all of them, which is not what they are about.
Each message still runs in a fresh ClientApp process on its node."""

from __future__ import annotations

import json
import shlex
import subprocess
import time

import pytest

from conftest import REPO, driftfl_bin
from driftfl.common.paths import console_script
from driftfl.host import stop
from support.deployment import deployment

pytestmark = pytest.mark.e2e
DEVIATING = REPO / "tests" / "e2e" / "hostile" / "deviating"  # a ServerApp of the audit's


@pytest.fixture(scope="module", autouse=True)
def _nginx(nginx_installed):
    """The fleet proxy's nginx."""


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, fmnist_available):
    """README's secure set-up with two SuperNodes, each holding partition i of 2 (and capping
    condensation at 20 iterations). A test may restart its SuperLink (on its database, so the
    nodes reconnect); it leaves it running."""
    logs = tmp_path_factory.mktemp("two-nodes")
    nodes = [f"dataset='fmnist' partition-id={i} num-partitions=2 max-condense-iterations=20"
             for i in range(2)]
    with deployment(nodes, logs) as cluster:
        yield cluster


def test_dcfl_condenses_and_exchanges_through_real_supernodes(tmp_path, two_nodes):
    """DCFL: the pre-training query, condensed sets up and complementary images down, with the
    server's store as the only memory (each message runs in a fresh client process)."""
    run_dir = tmp_path / "run"
    out = two_nodes("strategy=dcfl model=mlp dataset.subset=4000 dataset.test_subset=2000 "
                    "num_clients=2 rounds=2 node_wait=120 strategy.condense_iterations=20",
                    run_dir)
    assert (run_dir / "summary.json").is_file(), out.stdout[-3000:] + out.stderr[-3000:]
    assert "DCFL: each explored client sends the server 10 condensed images" in out.stdout
    rows = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.3, rows
    assert rows[1]["explored_total"] == 2 and rows[1]["pretrain_accuracy"] > 0.1
    # each node measured its own set against its own data, which never left it
    assert sorted(rows[1]["condensed_copies"]) == ["client_0", "client_1"]
    assert all(share <= 0.05 for share in rows[1]["condensed_copies"].values())
    assert rows[2]["condensed_bytes_sent"] > 0 and rows[2]["rejected"] == 0
    assert sorted(p.name for p in (run_dir / "images").iterdir()) == [
        "client_0.npz", "client_0.png", "client_1.npz", "client_1.png"]


def test_scaffold_and_moon_carry_client_state_between_rounds_through_real_supernodes(
        tmp_path, two_nodes):
    """SCAFFOLD's c_k and MOON's previous local model live in the node's state: each message
    runs in a fresh ClientApp process, so round 2 sees them only if the SuperNode kept them."""
    rows = {}
    for method in ("scaffold", "moon"):
        run_dir = tmp_path / method
        out = two_nodes(f"strategy={method} model=mlp dataset.subset=4000 "
                        "dataset.test_subset=2000 num_clients=2 rounds=2 node_wait=120", run_dir)
        assert (run_dir / "summary.json").is_file(), out.stdout[-3000:] + out.stderr[-3000:]
        rows[method] = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    for method, method_rows in rows.items():
        assert method_rows[-1]["test_accuracy"] > method_rows[0]["test_accuracy"] + 0.3, method
        assert all(r["clients"] == 2 and r["rejected"] == 0 for r in method_rows[1:]), method
    # round 1 trains with c_k = 0; round 2 with the c_k each node kept
    assert rows["scaffold"][1]["control_norm"] == 0 < rows["scaffold"][2]["control_norm"]
    # SCAFFOLD sends c with the model and replies Delta c_k: about twice FedAvg's bytes
    assert rows["scaffold"][2]["bytes_sent"] > 1.9 * rows["moon"][2]["bytes_sent"]
    # MOON: round 1 falls back to the global model, round 2 uses the stored previous model
    assert [r["moon_previous_model"] for r in rows["moon"][1:]] == [0, 1]


def test_simulation_and_deployment_train_the_same_bytes_also_across_a_superlink_restart(
        tmp_path, two_nodes, simulation_host):
    """The same experiment and seed in Flower's simulation and across real SuperNodes: the
    same partitions, the same order of sums, the same torch thread count, the same model. The
    deployed run (`driftfl run superlink=...`) loses its SuperLink after a round: driftfl
    exits non-zero saying how to go on; the SuperLink starts again on its database, the
    SuperNodes reconnect, and the resumed run ends with the same bytes. Each node holds out
    the same split (client_test_fraction) and trains the epochs the server drew for it
    (heterogeneity=epochs), so the per-client figures match too."""
    overrides = ["strategy=fedcsd", "model=mlp", "dataset.subset=3000", "dataset.test_subset=1000",
                 "num_clients=2", "rounds=3", "seed=3", "client_test_fraction=0.2",
                 "heterogeneity=epochs", "heterogeneity.max_epochs=3"]
    simulated, deployed = tmp_path / "simulated", tmp_path / "deployed"
    out = subprocess.run([driftfl_bin(), "run", *overrides, f"hydra.run.dir={simulated}"],
                         cwd=tmp_path, env=simulation_host, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    on_federation = [driftfl_bin(), "run", "superlink=deployment", *overrides, "node_wait=120"]
    cluster = two_nodes
    # the shared deployment: its SuperLink is stopped here and started again
    followed = tmp_path / "first.log"
    with open(followed, "w") as log:
        first = subprocess.Popen([*on_federation, f"hydra.run.dir={deployed}"],
                                 cwd=tmp_path, env=cluster.env, stdout=log,
                                 stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while not (deployed / "checkpoint.pt").exists():  # a round is done
        if first.poll() is not None or time.monotonic() > deadline:
            first.kill()
            logs = [followed, *(cluster.logs / f"{name}.log"
                                for name in ("superlink", "supernode0", "supernode1"))]
            raise AssertionError("the deployed run ended before its first round was saved:\n"
                                 + first.communicate()[1][-3000:] + "".join(
                                     f"\n--- {p.name}:\n{p.read_text()[-3000:]}"
                                     for p in logs if p.is_file()))
        time.sleep(0.2)
    stop(cluster.superlink)
    stopped = first.communicate(timeout=120)[1]
    assert not (deployed / "summary.json").exists()
    assert first.returncode == 1, stopped
    # the line that says how to go on: run as it says, once the SuperLink is back
    again = stopped.rsplit("go on with: ", 1)[1].strip()
    assert again.startswith("driftfl run ") and f"resume={deployed}" in again, stopped
    cluster.start_superlink()
    out = subprocess.run([driftfl_bin(), *shlex.split(again)[1:]], cwd=tmp_path,
                         env=cluster.env, capture_output=True, text=True, timeout=900)
    assert all(node.poll() is None for node in cluster.nodes.values())  # reconnected
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "driftfl: resuming" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads((d / "metrics.json").read_text())["rounds"] for d in (simulated, deployed)]
    assert [r["test_accuracy"] for r in rows[0]] == [r["test_accuracy"] for r in rows[1]]
    assert (simulated / "model.pt").read_bytes() == (deployed / "model.pt").read_bytes()
    assert len({r["local_steps"] for r in rows[1][1:]}) > 1  # the drawn epochs differ by round
    per_client = [(d / "clients.csv").read_text() for d in (simulated, deployed)]
    assert per_client[0] == per_client[1] and len(per_client[0].splitlines()) == 1 + 3 * 2


def test_secaggplus_aggregates_securely_through_real_supernodes(tmp_path, two_nodes):
    """secagg=secaggplus over TLS and node authentication: SecAgg+'s four stages through the
    SuperLink, each stage's message in a fresh ClientApp process (the protocol's keys and
    shares live in the SuperNode's context state); no array comes back to the server."""
    run_dir = tmp_path / "run"
    out = two_nodes("secagg=secaggplus model=mlp dataset.subset=2000 dataset.test_subset=1000 "
                    "num_clients=2 rounds=2 node_wait=120", run_dir)
    assert (run_dir / "summary.json").is_file(), out.stdout[-3000:] + out.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    rows = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.2, rows
    for row in rows[1:]:
        assert row["clients"] == 2 and row["model_updated"] == 1 and row["rejected"] == 0
        assert row.get("bytes_up_arrays", 0) == 0 and row["bytes_up_other"] > 0  # masked


def test_a_deviating_server_app_has_its_messages_refused_by_real_supernodes(tmp_path,
                                                                            two_nodes):
    """A ServerApp of the audit's (tests/e2e/hostile/deviating) against the module's real
    SuperNodes over TLS: a model array typed int64, an evaluate under privacy=distributed and
    a SecAgg+ round of one client, one share and a threshold of one are each refused by both
    nodes, in one line each, which reaches the server as the node's error reply."""
    said_file = tmp_path / "said.json"
    out = subprocess.run([console_script("flwr"), "run", str(DEVIATING), "deployment",
                          "--stream", "--run-config", f"out='{said_file}'"],
                         env=two_nodes.env, capture_output=True, text=True, timeout=600)
    assert said_file.is_file(), out.stdout[-3000:] + out.stderr[-3000:]
    said = json.loads(said_file.read_text())
    refusal = {
        "int64 array": "the 'arrays' record holds features.1.weight as int64 (200, 784); this "
                       "model has float32 (200, 784): refused",
        "evaluate": "evaluate asks for this node's exact loss and accuracy on its data, which "
                    "no noise covers; under differential privacy this node answers none: "
                    "refused",
        "secagg threshold 1": "SecAgg+: the server asks for a round of 1 client(s) in "
                              "neighbourhoods of 1; this node joins 2 at least "
                              "(min-secagg-clients): refused"}
    for case, line in refusal.items():
        assert len(said[case]) == 2 and all(line in reason for reason in said[case]), said
