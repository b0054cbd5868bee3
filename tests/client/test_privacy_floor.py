"""A node owns its privacy floor: its operator's --node-config (in simulation, its partition's
simulation.node_floors entry) names the least privacy it trains under, a message asking for
less is refused on the node in one line and counts as its dropout, and a node keeps the first
experiment of a run. Real messages through the real ClientApp; only "is this a simulation?" is
mocked where a test needs simulation."""

from __future__ import annotations

import csv
import json

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict

from driftfl.client import node
from driftfl.client.app import app
from driftfl.common.config import compose
from driftfl.common.privacy_floor import PrivacyFloor, floor_refusal
from driftfl.common.protocol import (CONFIG, CSD_PROTOTYPES, DATA_SUMMARY, DATASET_META,
                                     EXPERIMENT)
from driftfl.server.app import run_experiment
from driftfl.server.experiment import prepare_experiment
from test_methods import InProcessGrid
from test_node_boundary import FMNIST_META, experiment_json

NODE = {"dataset": "fmnist", "partition-id": 0, "num-partitions": 3}
DISTRIBUTED = ["privacy=distributed", "privacy.noise_multiplier=1", "privacy.clip=1",
               "num_clients=10", "privacy.min_survivors=0.5"]  # m_min = 5


@pytest.fixture
def simulated(monkeypatch):
    """Make the handlers believe they run in Flower's simulation (a Ray ClientAppActor)."""
    monkeypatch.setattr(node, "in_simulation", lambda: True)


def floor(**keys) -> PrivacyFloor:
    return PrivacyFloor.model_validate(keys)


@pytest.mark.parametrize("keys, overrides, why", [
    ({"min-privacy": "distributed"}, [], "privacy=none; this node trains only under "
                                         "privacy=distributed or stronger (min-privacy)"),
    ({"min-privacy": "distributed"}, ["privacy=central"], "privacy=central"),
    ({"min-privacy": "central"}, [], "privacy=none"),
    ({"min-noise-multiplier": 2}, DISTRIBUTED, "noise multiplier 1; this node accepts 2"),
    ({"min-noise-multiplier": 0.5}, [], "noise multiplier 0"),
    ({"max-clip": 0.5}, DISTRIBUTED, "clip 1; this node accepts a clip of 0.5 at most"),
    ({"max-clip": 0.5}, [], "no clip"),
    ({"max-cohort": 4}, DISTRIBUTED, "1/5 of the noise (m_min = 5: num_clients=10"),
    ({"max-cohort": 4}, [*DISTRIBUTED, "num_clients=1000"], "m_min = 500"),
])
def test_a_request_for_less_privacy_than_the_floor_is_refused(keys, overrides, why):
    assert why in floor_refusal(floor(**keys), compose(overrides))


@pytest.mark.parametrize("keys, overrides", [
    ({}, []),
    ({"min-privacy": "distributed", "min-noise-multiplier": 1, "max-clip": 1, "max-cohort": 5},
     DISTRIBUTED),
    ({"min-privacy": "central", "min-noise-multiplier": 1}, DISTRIBUTED),
    ({"max-cohort": 1}, ["privacy=central"]),  # central adds no share on the node
])
def test_a_request_at_or_above_the_floor_is_accepted(keys, overrides):
    assert floor_refusal(floor(**keys), compose(overrides)) is None


def test_secagg_is_required_of_training_messages_only():
    required = floor(**{"require-secagg": True})
    experiment = compose(DISTRIBUTED)
    assert "only inside SecAgg+" in floor_refusal(required, experiment, secure=False)
    assert floor_refusal(required, experiment, secure=True) is None
    assert floor_refusal(required, experiment, secure=None) is None  # not a training message


def message(experiment: str, message_type: str = f"query.{CSD_PROTOTYPES}") -> Message:
    content = RecordDict({CONFIG: ConfigRecord({EXPERIMENT: experiment,
                                                DATASET_META: FMNIST_META.to_json()})})
    return Message(content, dst_node_id=7, message_type=message_type)


def context(node_config: dict) -> Context:
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(),
                   run_config={})


def failure(node_config: dict, experiment: str, message_type: str = f"query.{CSD_PROTOTYPES}",
            node: Context | None = None) -> str:
    """Why the node's ClientApp fails the message ("": it answers)."""
    try:
        reply = app(message(experiment, message_type), node or context(node_config))
    except Exception as err:  # noqa: BLE001 - what the node says is the test's subject
        return str(err)
    return reply.error.reason if reply.has_error() else ""


def test_the_node_refuses_in_one_line_what_its_operator_did_not_allow(fmnist_available,
                                                                      server_task, capsys):
    strict = {**NODE, "min-privacy": "distributed", "min-noise-multiplier": 1}
    assert failure(strict, experiment_json()) == (
        "the server asks for privacy=none; this node trains only under privacy=distributed or "
        "stronger (min-privacy): refused")
    printed = capsys.readouterr().err.strip().splitlines()
    assert printed == [f"driftfl node: query.{CSD_PROTOTYPES} failed: the server asks for "
                       "privacy=none; this node trains only under privacy=distributed or "
                       "stronger (min-privacy): refused"]
    assert "(min-" not in failure(strict, experiment_json(DISTRIBUTED))  # at the floor
    # the data survey discloses the same under every setting: it passes, and the node is
    # then a dropout of every round rather than a run that cannot start
    assert failure(strict, experiment_json(), f"query.{DATA_SUMMARY}") == ""


def test_a_node_keeps_the_first_experiment_of_a_run(fmnist_available, server_task):
    node, survey = context(dict(NODE)), f"query.{DATA_SUMMARY}"
    private = experiment_json(DISTRIBUTED)
    assert failure(NODE, private, survey, node) == ""
    assert failure(NODE, private, survey, node) == ""  # the same again: fine
    assert "another experiment than this run's first message" in failure(
        NODE, experiment_json(), survey, node)  # privacy=none now
    assert failure(NODE, experiment_json(), survey) == ""  # another run (another context)


def test_node_floors_bind_simulated_nodes_and_never_deployed_ones(
        fmnist_available, simulated, server_task, monkeypatch):
    floors = experiment_json(["simulation.node_floors={0:{min-privacy:distributed}}"])
    assert "(min-privacy)" in failure(NODE, floors)  # partition 0 in simulation
    assert "(min-" not in failure({**NODE, "partition-id": 1}, floors)
    monkeypatch.setattr(node, "in_simulation", lambda: False)
    assert "(min-" not in failure(NODE, floors)  # a deployed node never reads it


def test_a_refusing_node_counts_as_a_dropout_and_the_run_goes_on(tmp_path, fmnist_available,
                                                                 server_task):
    """A DP run of 3 nodes, one of which accepts noise 4 at least: it passes the data survey
    and refuses every round's training; each round releases the other two shares."""
    cfg = compose(["strategy=fedavg", "model=mlp", "dataset.subset=1500",
                   "dataset.test_subset=200", "num_clients=3", "rounds=2",
                   "logit_shift_samples=8", "privacy=distributed",
                   "privacy.noise_multiplier=1", "privacy.min_survivors=2"])
    nodes = {100 + i: {"dataset": "fmnist", "partition-id": i, "num-partitions": 3}
             for i in range(3)}
    nodes[102]["min-noise-multiplier"] = 4
    summary = run_experiment(InProcessGrid(nodes), prepare_experiment(cfg), tmp_path, run_id=1)
    assert summary["status"] == "completed"
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))[1:]
    assert [(r["model_updated"], r["rejected_partitions"], r["clients"]) for r in rows] == [
        ("1", "2", "2")] * 2
    assert json.loads((tmp_path / "summary.json").read_text())["excluded"] == []
