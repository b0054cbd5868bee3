"""Per-client evaluation: each client's held-out split (client_test_fraction), the accuracies
measured on it before and after local training, and their spread across the clients."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from driftfl.client.assignment import held_out_accuracy
from driftfl.client.data import local_data
from driftfl.client.node import node_config
from driftfl.common.client_split import (ACC_AFTER, ACC_BEFORE, held_out_split, spread,
                                         held_out_count)
from driftfl.common.config import compose
from driftfl.methods import check_experiment
from driftfl.common.datasets import load_dataset
from driftfl.common.errors import ConfigError
from driftfl.common.partition import partition
from driftfl.common.protocol import DatasetMeta
from driftfl.server.client_eval import COLUMNS, client_figures, spread_columns
from driftfl.server.experiment import prepare_experiment
from driftfl.strategies.parts.aggregation import ClientUpdate
from driftfl.strategies.parts.round_plan import RoundPlan

LABELS = np.array([0] * 50 + [1] * 30 + [2] * 20)


def test_the_split_is_disjoint_covers_the_client_and_is_seeded():
    train, test = held_out_split(LABELS, 0.2, seed=3, partition_id=4)
    assert len(test) == 20 and len(train) == 80
    assert not set(train) & set(test) and sorted([*train, *test]) == list(range(100))
    again = held_out_split(LABELS, 0.2, seed=3, partition_id=4)
    assert [a.tolist() for a in again] == [train.tolist(), test.tolist()]
    other_seed = held_out_split(LABELS, 0.2, seed=4, partition_id=4)[1]
    other_client = held_out_split(LABELS, 0.2, seed=3, partition_id=5)[1]
    assert test.tolist() != other_seed.tolist() and test.tolist() != other_client.tolist()


def test_the_split_is_stratified_where_the_labels_allow():
    _, test = held_out_split(LABELS, 0.2, seed=0, partition_id=0)
    assert np.bincount(LABELS[test]).tolist() == [10, 6, 4]  # 20 % of each class
    # 7 of class 0, 2 of class 1, 1 of class 2 at 30 %: 3 to hold out, by largest remainders
    few = np.array([0] * 7 + [1] * 2 + [2])
    _, test = held_out_split(few, 0.3, seed=0, partition_id=0)
    assert np.bincount(few[test], minlength=3).tolist() == [2, 1, 0]


def test_no_split_without_a_fraction_and_one_sample_each_way_at_least():
    train, test = held_out_split(LABELS, 0.0, seed=0, partition_id=0)
    assert len(train) == 100 and len(test) == 0
    assert held_out_count(2, 0.01) == 1 and held_out_count(2, 0.99) == 1 and held_out_count(10, 0.25) == 2


def test_a_client_too_small_to_split_is_told_in_one_line():
    with pytest.raises(ConfigError) as err:
        held_out_split(np.array([3]), 0.2, seed=0, partition_id=7)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("partition 7 holds 1 example: too few to hold out "
                              "client_test_fraction=0.2")


def test_a_federation_with_a_client_too_small_to_split_is_refused_before_it_runs(
        fmnist_available):
    cfg = compose(["dataset.subset=100", "num_clients=100", "partition=iid",
                   "client_test_fraction=0.2"])  # one example each
    with pytest.raises(ConfigError, match=r"^partition 0 holds 1 example: too few"):
        prepare_experiment(cfg)
    assert prepare_experiment(cfg.model_copy(update={"client_test_fraction": 0.0}))


@pytest.mark.parametrize("simulation, node", [
    (True, {"partition-id": 1, "num-partitions": 3}),
    (False, {"dataset": "fmnist", "partition-id": 1, "num-partitions": 3})])
def test_the_same_split_in_simulation_and_deployment_and_on_the_server(
        fmnist_available, simulation, node):
    cfg = compose(["dataset.subset=3000", "num_clients=3", "client_test_fraction=0.25"])
    data = load_dataset(cfg.dataset)
    meta = DatasetMeta(list(data.classes), list(data.shape), list(data.mean), list(data.std))
    mine = local_data(cfg, meta, node_config(node), simulation=simulation)
    labels = data.train_y[partition(data.train_y, cfg.partition, 3, cfg.seed)[1]]
    train, test = held_out_split(labels, 0.25, cfg.seed, 1)
    assert mine.y.tolist() == labels[train].tolist()  # trains on the rest only
    assert mine.test_y.tolist() == labels[test].tolist()
    # the server counts what the node trains on (the survey and the step checks use it)
    histogram = prepare_experiment(cfg).partition_histograms()[1]
    assert histogram == np.bincount(labels[train], minlength=10).tolist()


class FirstClass(nn.Module):
    """Always predicts class 0."""

    def forward(self, x):
        return torch.stack([torch.ones(len(x)), torch.zeros(len(x))], 1)


def test_a_model_right_on_half_of_the_split_reads_fifty_percent():
    y = torch.tensor([0, 1, 0, 1, 0, 1])
    job = SimpleNamespace(data=SimpleNamespace(test_x=torch.zeros(6, 1), test_y=y),
                          device=torch.device("cpu"), num_classes=2,
                          experiment=SimpleNamespace(eval_batch_size=4))
    assert held_out_accuracy(job, FirstClass()) == 0.5


def update(node, before, after):
    return ClientUpdate(node, {}, {ACC_BEFORE: before, ACC_AFTER: after}, None)


def test_spread_and_worst_ten_percent_on_known_lists():
    figures = spread([0.9, 0.1, 0.5, 0.7, 0.3, 0.6, 0.8, 0.2, 0.4, 1.0])  # ten clients
    assert figures["mean"] == pytest.approx(0.55) and figures["best"] == 1.0
    assert figures["worst10"] == pytest.approx(0.1)  # the one worst of ten
    assert figures["std"] == pytest.approx(np.std(np.arange(1, 11) / 10))
    eleven = spread([0.5] * 9 + [0.2, 0.0])  # ceil(1.1) = the two worst
    assert eleven["worst10"] == pytest.approx(0.1)


def test_the_rows_columns_and_per_client_rows_from_the_accepted_replies():
    updates = [update(5, 0.5, 0.75), update(6, 0.25, 1.0), ClientUpdate(7, {}, {}, None)]
    figures = client_figures(3, updates, lambda node: str(node - 5))
    assert figures == [{"round": 3, "client": "0", "acc_before": 0.5, "acc_after": 0.75},
                       {"round": 3, "client": "1", "acc_before": 0.25, "acc_after": 1.0}]
    row = spread_columns(figures)
    assert sorted(row) == sorted(COLUMNS)
    assert row["client_acc_before_mean"] == pytest.approx(0.375)
    assert row["client_acc_before_worst10"] == 0.25 and row["client_acc_after_best"] == 1.0
    assert row["client_acc_after_std"] == pytest.approx(0.125)
    assert spread_columns([]) == {}


def test_who_evaluates_when_and_how_many():
    plan = RoundPlan(client_eval=True, eval_every=3, eval_clients=2, rounds=10, seed=1)
    key, count = (lambda n: n - 100), (lambda n: 50.0)
    nodes = [100, 101, 102, 103, 104]
    asked = {r: (plan.start(r, nodes, key, count, None), set(plan.evaluated))[1]
             for r in range(1, 11)}
    assert [r for r, chosen in asked.items() if chosen] == [3, 6, 9, 10]  # and the last
    assert all(len(asked[r]) == 2 for r in (3, 6, 9, 10))
    plan.start(3, nodes, key, count, None)
    assert plan.evaluated == asked[3]  # seeded
    everyone = RoundPlan(client_eval=True, rounds=2)
    everyone.start(1, nodes, key, count, None)
    assert everyone.evaluated == set(nodes)
    assert RoundPlan(client_eval=False).start(1, nodes, key, count, None) == nodes


def test_accuracies_are_checked_asked_for_and_in_range():
    plan = RoundPlan(client_eval=True, rounds=1)
    plan.start(1, [5], lambda n: 0, lambda n: 10.0, None)
    assert plan.reject(update(5, 0.5, 1.0)) is None
    assert "in [0, 1]" in plan.reject(update(5, 0.5, 1.5))
    assert "in [0, 1]" in plan.reject(ClientUpdate(5, {}, {ACC_BEFORE: 0.5}, None))
    assert "not asked" in plan.reject(update(6, 0.5, 0.5))


@pytest.mark.parametrize("override, message", [
    (["client_test_fraction=1"], "client_test_fraction must be in [0, 1), got 1"),
    (["client_test_fraction=-0.1"], "client_test_fraction must be in [0, 1), got -0.1"),
    (["client_test_fraction=0.2", "privacy=central"], "client_test_fraction with privacy=central"),
    (["client_test_fraction=0.2", "secagg=secaggplus"], "client_test_fraction with secagg"),
])
def test_bad_per_client_settings_are_refused_in_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        check_experiment(compose(override))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_clients_csv_keeps_every_round_and_a_resumed_run_the_rounds_before_it(tmp_path):
    from driftfl.server.results import RunRecorder

    cfg = compose(["client_test_fraction=0.2"])
    recorder = RunRecorder(tmp_path, cfg)
    for server_round in (1, 2, 3):
        recorder.add_clients(server_round, [
            {"round": server_round, "client": "0", "acc_before": 0.25, "acc_after": 0.5}])
    recorder.add_clients(4, [])  # a round that measured nothing writes nothing
    lines = (tmp_path / "clients.csv").read_text().splitlines()
    assert lines == ["round,client,acc_before,acc_after", "1,0,0.25,0.5", "2,0,0.25,0.5",
                     "3,0,0.25,0.5"]
    # the checkpoint was written after round 2: round 3's row goes, round 3 runs again
    resumed = RunRecorder(tmp_path, cfg, resumed={"rows": [], "recorded": {}, "seconds": 1.0,
                                                  "round": 2})
    resumed.add_clients(3, [{"round": 3, "client": "0", "acc_before": 0.5, "acc_after": 0.75}])
    assert (tmp_path / "clients.csv").read_text().splitlines()[1:] == [
        "1,0,0.25,0.5", "2,0,0.25,0.5", "3,0,0.5,0.75"]


def test_clients_csv_names_every_clients_outcome_and_clients_png_draws_it(tmp_path):
    from types import SimpleNamespace

    from driftfl.common.client_split import ACC_AFTER, ACC_BEFORE
    from driftfl.server.client_eval import client_rows
    from driftfl.server.results import RunRecorder
    from driftfl.strategies.parts.clients import KnownClients
    from driftfl.strategies.round_report import RoundReport

    clients = KnownClients()
    clients.meet([{"node_id": 100 + p, "partition_id": p, "num_examples": 10 * (p + 1)}
                  for p in range(5)] + [{"node_id": 7, "partition_id": -1, "num_examples": 3}])
    report = RoundReport(rejected_partitions=["1"], dropped=["4"], lost=["node7"], late=["2"])
    measured = SimpleNamespace(node_id=103, metrics={ACC_BEFORE: 0.25, ACC_AFTER: 0.75})
    rows = client_rows(5, report, [SimpleNamespace(node_id=100, metrics={}), measured],
                       clients)
    assert [(r["client"], r["examples"], r["outcome"]) for r in rows] == [
        ("0", 10, "accepted"), ("1", 20, "rejected"), ("2", 30, "late"), ("3", 40, "accepted"),
        ("4", 50, "dropped"), ("node7", 3, "lost")]
    assert rows[3] == {"round": 5, "client": "3", "examples": 40, "outcome": "accepted",
                       "acc_before": 0.25, "acc_after": 0.75}
    recorder = RunRecorder(tmp_path, compose([]))
    recorder.add_clients(5, rows)
    assert (tmp_path / "clients.csv").read_text().splitlines()[:5] == [
        "round,client,examples,outcome,acc_before,acc_after", "5,0,10,accepted,,",
        "5,1,20,rejected,,", "5,2,30,late,,", "5,3,40,accepted,0.25,0.75"]
    from driftfl.server.results import plot_clients

    plot_clients(recorder.clients, tmp_path / "clients.png", "t")
    assert (tmp_path / "clients.png").stat().st_size > 0
