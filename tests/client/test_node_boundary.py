"""A deployment node reads only what its operator named, caps what a server may ask, and keeps
its paths out of error replies. Real Flower messages and contexts go through the real
ClientApp; only "is this a simulation?" is mocked, where a test needs simulation."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.config import parse_config_args
from PIL import Image

from driftfl.client import node
from driftfl.client.app import app
from driftfl.client.data import operator_dataset
from driftfl.client.node import NO_DATA_NAMED, SIMULATION_TASK, node_config
from driftfl.client.redaction import redact
from driftfl.common.config import compose, experiment_config
from driftfl.common.datasets import FMNIST_CLASSES, dataset_settings
from driftfl.common.errors import ConfigError
from driftfl.common.protocol import (ASSIGNED_PARTITION, CONDENSE, CONFIG, DATA_SUMMARY,
                                     DATASET_META, EXPERIMENT, METRICS, NUM_EXAMPLES,
                                     NUM_PARTITIONS, DatasetMeta)

FMNIST_META = DatasetMeta(list(FMNIST_CLASSES), [1, 28, 28], [0.286], [0.353])
TINY = ["model=mlp", "dataset.subset=2000", "dataset.test_subset=100"]

# Every file access Python audits (open, listing, mkdir, unpickling), recorded while `watching`.
ACCESSES: list[tuple[str, str]] = []
watching = False


def _audit(event: str, args: tuple) -> None:
    if watching and event in ("open", "os.listdir", "os.scandir", "os.mkdir",
                              "pickle.find_class"):
        ACCESSES.append((event, str(args[0]) if args else ""))


sys.addaudithook(_audit)  # audit hooks cannot be removed: this one is idle unless `watching`


@pytest.fixture
def accesses():
    """The file accesses during the test (clear it where the node's part begins)."""
    global watching
    ACCESSES.clear()
    watching = True
    yield ACCESSES
    watching = False


@pytest.fixture
def simulated(monkeypatch):
    """Make the handlers believe they run in Flower's simulation (a Ray ClientAppActor)."""
    monkeypatch.setattr(node, "in_simulation", lambda: True)


def experiment_json(overrides=(), dataset: dict | None = None, strategy: dict | None = None,
                    **settings) -> str:
    """A checked experiment, as a server sends it, with a dataset section of its choosing."""
    data = json.loads(compose([*TINY, *overrides]).to_json())
    data.update(settings)
    if dataset is not None:
        data["dataset"] = dataset
    if strategy is not None:
        data["strategy"].update(strategy)
    return experiment_config(data).to_json()


def ask(node_cfg: dict, experiment: str, meta: DatasetMeta = FMNIST_META,
        message_type: str = f"query.{DATA_SUMMARY}", **config) -> Message:
    """Send one message through the real ClientApp, as the SuperNode would."""
    content = RecordDict({CONFIG: ConfigRecord({EXPERIMENT: experiment,
                                                DATASET_META: meta.to_json(), **config})})
    message = Message(content, dst_node_id=7, message_type=message_type)
    context = Context(run_id=1, node_id=7, node_config=node_cfg, state=RecordDict(),
                      run_config={})
    return app(message, context)


def refusal(node_cfg: dict, experiment: str, **kwargs) -> str:
    with pytest.raises(Exception) as raised:
        ask(node_cfg, experiment, **kwargs)
    return str(raised.value)


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


class Touch:
    """A pickle that, when loaded, creates a marker file: the code execution of the probe."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


# --- crafted data on the node, named by the server ---------------------------------------

def crafted_npz(secret: Path) -> dict:
    np.savez(secret / "victim.npz", x=np.zeros((4, 28, 28), np.uint8), y=np.arange(4))
    return {"name": "npz", "root": str(secret / "victim.npz")}


def crafted_cifar(secret: Path) -> dict:
    folder = secret / "cifar-10-batches-py"
    folder.mkdir()
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"]:
        (folder / name).write_bytes(pickle.dumps(Touch(secret.parent / "pwned")))
    return {"name": "cifar10", "root": str(secret)}


def crafted_folder(secret: Path) -> dict:
    for name in ("cat", "dog"):
        (secret / name).mkdir()
        Image.fromarray(np.zeros((8, 8), np.uint8), "L").save(secret / name / "a.png")
    return {"name": "folder", "root": str(secret), "image_size": 8, "channels": 1}


@pytest.fixture
def own_npz(tmp_path) -> Path:
    """The operator's own data: 6 Fashion-MNIST-shaped images."""
    path = tmp_path / "owner" / "mine.npz"
    path.parent.mkdir()
    np.savez(path, x=np.full((6, 28, 28), 9, np.uint8), y=np.array([0, 1, 2, 0, 1, 2]))
    return path


@pytest.mark.parametrize("craft", [crafted_npz, crafted_cifar, crafted_folder])
def test_a_path_the_server_names_is_never_read(craft, tmp_path, own_npz, server_task,
                                               accesses):
    secret = tmp_path / "secret"
    secret.mkdir()
    experiment = experiment_json(dataset=craft(secret))
    before = snapshot(secret)
    name = json.loads(experiment)["dataset"]["name"]
    mine = tmp_path / "mine"
    mine.mkdir()
    accesses.clear()  # from here on every file access is the node's

    # the probe's node (partition keys only), a node holding another dataset, a node holding
    # this dataset in its own (empty) place, and a node with its own file
    assert refusal({"partition-id": 0, "num-partitions": 2}, experiment).endswith(
        NO_DATA_NAMED)
    assert f"the server asks for dataset '{name}', but this node holds 'fmnist'" in refusal(
        {"dataset": "fmnist", "partition-id": 0, "num-partitions": 2}, experiment)
    if name == "cifar10":
        assert "CIFAR-10 not found in <dataset-root>/cifar-10-batches-py" in refusal(
            {"dataset": "cifar10", "dataset-root": str(mine), "partition-id": 0,
             "num-partitions": 2}, experiment)
    reply = ask({"data-dir": str(own_npz)}, experiment)
    assert reply.content[METRICS][NUM_EXAMPLES] == 6  # its own file, not the server's

    touched = [a for a in accesses if str(secret) in a[1] or a[0] == "pickle.find_class"]
    assert touched == []  # never opened, listed or unpickled
    assert any(str(own_npz) in a[1] for a in accesses)  # while the hook did see the own file
    assert not (tmp_path / "pwned").exists()  # no pickle ran
    assert snapshot(secret) == before  # the crafted files are untouched


def test_the_crafted_pickle_is_live_and_a_simulated_node_reads_the_servers_root(
        tmp_path, server_task, simulated):
    """The control: the crafted pickle above runs code when unpickled, and in simulation (one
    person's processes) nodes read the experiment's dataset where it says: there the node reads
    the crafted batch, and refuses it without running it."""
    pickle.loads(pickle.dumps(Touch(tmp_path / "live")))
    assert (tmp_path / "live").exists()
    secret = tmp_path / "secret"
    secret.mkdir()
    experiment = experiment_json(dataset=crafted_cifar(secret))
    said = refusal({"partition-id": 0, "num-partitions": 2}, experiment)
    assert "is not a CIFAR python batch (it asks for pathlib.Path.touch)" in said, said
    assert not (tmp_path / "pwned").exists()


def test_download_from_the_server_creates_nothing(tmp_path, monkeypatch, server_task,
                                                  accesses):
    monkeypatch.setenv("DRIFTFL_DATA", str(tmp_path / "data"))
    experiment = experiment_json(
        dataset={"name": "mnist", "root": str(tmp_path / "fetched"), "download": True})
    reason = refusal({"dataset": "mnist", "partition-id": 0, "num-partitions": 2}, experiment)
    assert reason == ("MNIST not found in <default data place>/mnist. Set dataset-download=true "
                      "in --node-config to fetch MNIST with torchvision (needs internet), or "
                      "point dataset-root in --node-config at a copy in torchvision's format.")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no folder, here or there
    assert [a for a in accesses if a[0] == "os.mkdir"] == []


def test_only_the_operator_chooses_the_place_and_the_download():
    server = dataset_settings({"name": "mnist", "root": "/server/choice", "download": True,
                               "subset": 100})
    quiet = operator_dataset(server, node_config(
        {"dataset": "mnist", "partition-id": 0, "num-partitions": 2}))
    assert (quiet.root, quiet.download, quiet.subset) == (None, False, 100)
    fetching = operator_dataset(server, node_config(
        {"dataset": "mnist", "dataset-root": "/srv/mnist", "dataset-download": True,
         "partition-id": 0, "num-partitions": 2}))
    assert (fetching.root, fetching.download) == ("/srv/mnist", True)


# --- error replies ---------------------------------------------------------------------------

def test_an_error_reply_names_the_problem_but_no_node_path(tmp_path, server_task, capsys):
    missing = tmp_path / "owner" / "data.npz"
    reason = refusal({"data-dir": str(missing)}, experiment_json())
    # what Flower sends the server: "<class '...'>:<'" + str(error) + "'>"
    assert reason == "npz file <data-dir> does not exist"
    assert str(tmp_path) not in reason
    assert f"npz file {missing} does not exist" in capsys.readouterr().err  # the node's log


def test_an_unexpected_error_is_redacted_too(tmp_path, server_task, capsys):
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "broken.png").write_bytes(b"not a png")
    reason = refusal({"data-dir": str(tmp_path)}, experiment_json(), meta=DatasetMeta(
        ["cat"], [1, 8, 8], [0.5], [0.25]))
    assert reason.startswith("UnidentifiedImageError: cannot identify image file")
    assert "<data-dir>/cat/broken.png" in reason and str(tmp_path) not in reason
    log = capsys.readouterr().err
    assert str(tmp_path / "cat" / "broken.png") in log and "Traceback" in log


def test_a_simulated_nodes_errors_are_not_redacted(tmp_path, server_task, simulated):
    missing = tmp_path / "data.npz"
    assert str(missing) in refusal({"data-dir": str(missing)}, experiment_json())


def test_redaction_keeps_the_sentence_and_drops_every_path(tmp_path):
    config = {"data-dir": "~/own/x.npz", "dataset-root": str(tmp_path)}
    home = Path.home()
    assert redact(f"npz file {home}/.ssh/id_rsa.npz does not exist", {}) == (
        "npz file <local path> does not exist")
    assert redact(f"{home}/own/x.npz: 3 images but 2 labels", config) == (
        "<data-dir>: 3 images but 2 labels")
    assert redact(f"CIFAR-10 not found in {tmp_path}/cifar-10-batches-py.", config) == (
        "CIFAR-10 not found in <dataset-root>/cifar-10-batches-py.")
    assert redact("No such file: '/etc/shadow' or ../up/x", {}) == (
        "No such file: '<local path>' or <local path>")
    kept = "partition 0/2 of T-shirt/top; expected <data-dir>/<class>/<image>.png, 0..1"
    assert redact(kept, {}) == kept


# --- caps --------------------------------------------------------------------------------

@pytest.mark.parametrize("cap, experiment, expected", [
    ({"max-local-epochs": 5}, {"settings": {"local_epochs": 50}},
     "local_epochs 50 exceeds this node's max-local-epochs=5"),
    ({"max-batch-size": 64}, {"settings": {"batch_size": 128}},
     "batch_size 128 exceeds this node's max-batch-size=64"),
    ({"max-parameters": 100_000}, {"overrides": ["model=cnn"]},
     "model cnn has 1663370 parameters, which exceeds this node's max-parameters=100000"),
    ({"max-condense-iterations": 50}, {"overrides": ["strategy=dcfl"]},
     "strategy.condense_iterations 1000 exceeds this node's max-condense-iterations=50"),
    ({"max-local-epochs": 2}, {"overrides": ["strategy=dcfl"],
                               "strategy": {"finetune_epochs": 3}},
     "strategy.finetune_epochs 3 exceeds this node's max-local-epochs=2"),
])
def test_a_request_over_a_cap_is_refused_before_reading_data(cap, experiment, expected,
                                                             tmp_path, server_task, accesses):
    data = tmp_path / "never-read.npz"
    exp = experiment_json(experiment.get("overrides", ()), strategy=experiment.get("strategy"),
                          **experiment.get("settings", {}))
    assert refusal({"data-dir": str(data), **cap}, exp, message_type="train") == expected
    assert not [a for a in accesses if str(data) in a[1]]


def test_a_dcfl_message_is_capped_whatever_the_strategy_says(tmp_path, server_task):
    """A server cannot dodge max-condense-iterations by naming another strategy."""
    reason = refusal({"data-dir": str(tmp_path / "x.npz"), "max-condense-iterations": 10},
                     experiment_json(), message_type="train", **{CONDENSE: True})
    assert reason == "strategy.condense_iterations 1000 exceeds this node's " \
                     "max-condense-iterations=10"


def test_a_request_within_the_caps_is_answered(fmnist_available, server_task):
    node_cfg = {"dataset": "fmnist", "partition-id": 1, "num-partitions": 2,
                "max-parameters": 200_000, "max-local-epochs": 1, "max-batch-size": 32,
                "max-condense-iterations": 200}
    reply = ask(node_cfg, experiment_json())
    assert 0 < reply.content[METRICS][NUM_EXAMPLES] < 2000  # its share of 2,000 samples


# --- the node config itself ------------------------------------------------------------

def test_flowers_parser_types_the_keys_as_the_node_config_expects():
    parsed = parse_config_args(["dataset='fmnist' dataset-root='/usr/share/datasets/"
                                "fashion-mnist' partition-id=0 num-partitions=4 "
                                "max-parameters=1_000_000 max-local-epochs=5 "
                                "dataset-download=false"])
    checked = node_config(parsed)
    assert (checked.dataset, checked.partition_id, checked.max_parameters,
            checked.dataset_download) == ("fmnist", 0, 1_000_000, False)


@pytest.mark.parametrize("config, expected", [
    ({"max-epochs": 3}, "unknown --node-config key 'max-epochs' (did you mean "
                        "max-local-epochs?); valid keys: data-dir, dataset, dataset-download, "
                        "dataset-root, max-batch-size, max-clip, max-cohort, "
                        "max-condense-iterations, max-local-epochs, max-parameters, "
                        "min-noise-multiplier, min-privacy, min-secagg-clients, "
                        "min-secagg-threshold, num-partitions, partition-id, "
                        "require-secagg, threads"),
    ({"data-dir": "/x", "max-local-epochs": "5"},
     "--node-config max-local-epochs must be a whole number, got '5'"),
    ({"dataset": "fmnist"}, "--node-config dataset='fmnist' needs partition-id=<i> "
                            "num-partitions=<n>: this node's share of it"),
    ({"dataset": "npz", "partition-id": 0, "num-partitions": 1},
     "--node-config dataset 'npz' has no default place: add dataset-root='<path>'"),
    ({"data-dir": "/x", "dataset": "fmnist", "partition-id": 0, "num-partitions": 1},
     "--node-config data-dir and dataset both name this node's data: keep one"),
    ({"partition-id": 3, "num-partitions": 2},
     "--node-config partition-id 3 is outside 0..1 (num-partitions=2)"),
])
def test_a_bad_node_config_is_refused_in_one_line(config, expected):
    with pytest.raises(ConfigError) as raised:
        node_config(config)
    assert str(raised.value) == expected


def test_the_one_line_for_a_node_without_data():
    assert NO_DATA_NAMED == (
        "this node names no data of its own: add data-dir='<folder or .npz>', or "
        "dataset='<name>' partition-id=<i> num-partitions=<n> (and dataset-root='<dir>' "
        "unless the dataset is in its default place) to the SuperNode's --node-config")


# --- how a node knows it is simulated ------------------------------------------------------

@pytest.mark.e2e
def test_only_flowers_simulation_actor_counts_as_simulation(fmnist_available, server_task,
                                                             monkeypatch):
    """The real ClientApp in the real simulation actor reads the experiment's dataset; the same
    message and node config anywhere else (a plain process, another Ray actor) is refused."""
    import ray
    from flwr.simulation.ray_transport.ray_actor import ClientAppActor

    experiment = experiment_json()
    partition_keys = {"partition-id": 0, "num-partitions": 2}  # what simulation nodes get
    content = RecordDict({CONFIG: ConfigRecord({EXPERIMENT: experiment,
                                                DATASET_META: FMNIST_META.to_json()})})
    message = Message(content, dst_node_id=7, message_type=f"query.{DATA_SUMMARY}")
    context = Context(run_id=1, node_id=7, node_config=partition_keys, state=RecordDict(),
                      run_config={})
    assert node.in_simulation() is False
    with pytest.raises(ConfigError, match="names no data of its own"):
        app(message, context)

    @ray.remote
    class Impostor:
        def check(self):
            from driftfl.client.node import in_simulation
            return in_simulation()

    monkeypatch.setenv("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # silences a Ray notice
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        actor = ClientAppActor.remote()
        _, reply, _ = ray.get(actor.run.remote(lambda: app, message, "0", context))
        assert reply.content[METRICS][NUM_EXAMPLES] > 0
        assert ray.get(Impostor.remote().check.remote()) is False
        assert SIMULATION_TASK.endswith("ClientAppActor.run")
    finally:
        ray.shutdown()


# --- the server's partition assignment: heeded in simulation only --------------------------

def summary_partition(reply: Message) -> int:
    return reply.content.metric_records[METRICS]["partition-id"]


def test_a_deployed_node_ignores_a_partition_the_server_assigns(fmnist_available, server_task):
    operator = {"dataset": "fmnist", "partition-id": 0, "num-partitions": 4}
    reply = ask(operator, experiment_json(), **{ASSIGNED_PARTITION: 3, NUM_PARTITIONS: 4})
    assert summary_partition(reply) == 0  # what its operator named


def test_a_simulated_node_reads_the_partition_the_server_assigns(fmnist_available, server_task,
                                                                simulated):
    flower = {"partition-id": 0, "num-partitions": 4}  # Flower's own numbering of its nodes
    assert summary_partition(ask(flower, experiment_json(num_clients=4))) == 0
    reply = ask(flower, experiment_json(num_clients=4),
                **{ASSIGNED_PARTITION: 3, NUM_PARTITIONS: 4})
    assert summary_partition(reply) == 3
