"""A hostile or broken client cannot ruin or capture the global model: each crafted reply the
probe sent is refused with its reason, named by partition, and touches no model or state."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import (Array, ArrayRecord, ConfigRecord, Message, Metadata, MetricRecord,
                      RecordDict)

from driftfl.common.config import compose
from driftfl.common.errors import ConfigError
from driftfl.common.training import TrainSettings
from driftfl.methods import build_strategy, check_experiment
from driftfl.common.protocol import (ARRAYS, DATASET_META, LABEL_HISTOGRAM,
                                     LOCAL_STEPS, METRICS, NUM_EXAMPLES, PARTITION_ID)
from driftfl.server.app import run_experiment
from driftfl.server.experiment import prepare_experiment
from driftfl.server.survey import survey_clients
from driftfl.strategies import FedAvg, FedNovaAggregation
from test_methods import TINY, InProcessGrid, fmnist_nodes

GLOBAL = {"w": np.array([1.0, 1.0], np.float32)}
META = json.dumps({"classes": ["a", "b", "c"], "shape": [1, 2, 2], "mean": [0.0],
                   "std": [1.0], "aux_per_class": 0})


def metadata(node, kind="train"):
    return Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0,
                    reply_to_message_id="m", group_id="", created_at=0.0, ttl=10,
                    message_type=kind)


def train_reply(node, w, n, steps=1, **metrics):
    return Message(metadata=metadata(node), content=RecordDict({
        ARRAYS: ArrayRecord({"w": Array(np.asarray(w, np.float32))}),
        METRICS: MetricRecord({NUM_EXAMPLES: n, LOCAL_STEPS: steps, **metrics})}))


def summary_reply(node, partition, n, histogram):
    return Message(metadata=metadata(node, "query.data_summary"), content=RecordDict(
        {METRICS: MetricRecord({PARTITION_ID: partition, NUM_EXAMPLES: n,
                                LABEL_HISTOGRAM: histogram})}))


class ScriptedGrid:
    """A Grid whose nodes answer with the replies a test wrote for them."""

    def __init__(self, replies: list[Message]):
        self.replies = replies

    def get_node_ids(self):
        return [r.metadata.src_node_id for r in self.replies]

    def send_and_receive(self, messages, timeout=None):
        return self.replies


def surveyed(strategy, clients):
    strategy.global_arrays = {k: v.copy() for k, v in GLOBAL.items()}
    strategy.meet(clients)
    return strategy


@pytest.fixture(autouse=True)
def _task(server_task):  # the survey creates messages
    yield


def survey(replies):
    return survey_clients(ScriptedGrid(replies), ConfigRecord({DATASET_META: META}),
                          len(replies), node_wait=5, timeout=5)


def test_the_survey_refuses_malformed_summaries_and_a_second_claim_on_a_partition():
    clients = survey([
        summary_reply(11, 0, 5, [2, 3, 0]),
        summary_reply(12, 0, 4, [4, 0, 0]),  # a second claimant of partition 0
        summary_reply(13, 1, -7, [0] * 15),  # the probe's 15 entries and n = -7
        summary_reply(14, 2, 5, [1, 1, 1]),  # histogram does not sum to n
        summary_reply(15, 2, 3, [1, -1, 3]),  # negative count
        summary_reply(16, 9, 3, [1, 1, 1]),  # no partition 9 among 7 clients
        summary_reply(17, 1, 3, [1, 1, 1]),
    ])
    assert [(c["node_id"], c["partition_id"]) for c in clients] == [(11, 0), (17, 1)]


def test_a_refused_node_is_never_sampled_to_train():
    clients = survey([summary_reply(11, 0, 5, [2, 3, 0]), summary_reply(12, 0, 4, [4, 0, 0]),
                      summary_reply(13, 1, 3, [1, 1, 1])])
    strategy = surveyed(FedAvg(min_available_nodes=3), clients)
    assert strategy.sample(1, ScriptedGrid([summary_reply(n, 0, 1, [1, 0, 0])
                                            for n in (11, 12, 13)])) == [11, 13]


def test_the_survey_fails_the_run_when_no_node_is_usable():
    with pytest.raises(ConfigError, match="no node gave a usable data summary"):
        survey([summary_reply(11, 0, 5, [1, 1, 1])])


def test_a_client_cannot_claim_more_examples_than_it_holds_or_train_unsurveyed():
    # the probe's num-examples 1e30 would have made the global model that client's
    strategy = surveyed(FedAvg(), [{"node_id": 1, "partition_id": 0, "num_examples": 10},
                                   {"node_id": 2, "partition_id": 4, "num_examples": 10}])
    arrays, _ = strategy.aggregate_train(1, [train_reply(1, [3.0, 3.0], n=10),
                                             train_reply(2, [9.0, 9.0], n=1e30),
                                             train_reply(3, [9.0, 9.0], n=5)])
    assert np.allclose(arrays["w"].numpy(), [3.0, 3.0])
    assert strategy.report.rejected_partitions == ["4", "node3"]
    assert strategy.report.rejected[0] == (  # over any metric's bound (columns.MAX_METRIC)
        "partition 4 (node 2): metric 'num-examples' is 1e+30, over 1e+12 in magnitude")
    assert "not accepted in the data survey" in strategy.report.rejected[1]


def test_large_weights_and_infinite_step_counts_never_reach_the_global_model():
    strategy = surveyed(FedAvg(aggregation=FedNovaAggregation(
        momentum=0.0, param_keys=frozenset({"w"}))),
        [{"node_id": n, "partition_id": n, "num_examples": 10} for n in (1, 2)])
    # weights of 3e38, and a FedNova step count of inf: each reply refused
    arrays, _ = strategy.aggregate_train(1, [train_reply(1, [3e38, -3e38], n=10),
                                             train_reply(2, [2.0, 2.0], n=10,
                                                         steps=float("inf"))])
    assert arrays is None and strategy.report.clients == 0
    # a step count of 1e12 (the most a metric may be) passes the reply check but makes
    # FedNova's aggregate huge: the aggregate is checked before it replaces the model, refused
    arrays, _ = strategy.aggregate_train(2, [train_reply(1, [1.5, 1.5], n=10, steps=2),
                                             train_reply(2, [1.0, 0.5], n=10, steps=1e12)])
    assert arrays is None and "exceeds the bound" in strategy.report.refused_aggregate
    assert strategy.last_aggregate == {}  # no state took the refused aggregate


def test_a_step_count_other_than_the_one_the_clients_training_makes_is_refused():
    """FedNova and SCAFFOLD scale a reply by its local-steps, so it must be the count the
    experiment's training makes of the node's examples: 3 epochs of 10 examples in batches
    of 4 are 9 steps, of 7 examples 6. An inflated count within the bounds would have tilted
    FedNova's tau_eff; a deflated one multiplies SCAFFOLD's Delta c_k. A client trains on all
    it holds, so it cannot lower its count by claiming fewer examples either."""
    strategy = surveyed(
        FedAvg(aggregation=FedNovaAggregation(momentum=0.0, param_keys=frozenset({"w"})),
               local_training=TrainSettings(3, 4, 0.1, 0.0, 0.0)),
        [{"node_id": n, "partition_id": n, "num_examples": 7 if n == 3 else 10}
         for n in (1, 2, 3, 4)])
    arrays, _ = strategy.aggregate_train(1, [train_reply(1, [2.0, 2.0], n=10, steps=9),
                                             train_reply(2, [9.0, 9.0], n=10, steps=90),
                                             train_reply(3, [9.0, 9.0], n=7, steps=9),
                                             train_reply(4, [9.0, 9.0], n=0.001, steps=3)])
    assert np.allclose(arrays["w"].numpy(), [2.0, 2.0]) and strategy.report.clients == 1
    assert strategy.report.rejected == [
        "partition 2 (node 2): 'local-steps' is 90, but 3 epochs of its 10 examples in batches "
        "of 4 make 9",
        "partition 3 (node 3): 'local-steps' is 9, but 3 epochs of its 7 examples in batches "
        "of 4 make 6",
        "partition 4 (node 4): it claims 0.001 examples; the data survey found 10"]
    # a strategy built for an experiment knows how its clients train
    built = build_strategy(check_experiment(compose(["local_epochs=2", "batch_size=32"])),
                           torch.nn.Linear(2, 2))
    assert built.local_training.steps(100) == 8


def test_evaluation_replies_are_checked_too():
    strategy = surveyed(FedAvg(), [{"node_id": n, "partition_id": n, "num_examples": 10}
                                   for n in (1, 2, 3)])

    def evaluation(node, n, accuracy):
        return Message(metadata=metadata(node, "evaluate"), content=RecordDict(
            {METRICS: MetricRecord({NUM_EXAMPLES: n, "local-accuracy": accuracy})}))

    metrics = strategy.aggregate_evaluate(1, [evaluation(1, 10, 0.5),
                                              evaluation(2, 10, float("nan")),
                                              evaluation(3, 1e9, 0.9)])
    assert dict(metrics) == {"local-accuracy": 0.5}


def test_a_run_whose_rounds_never_get_a_usable_reply_fails_and_says_why(
        fmnist_available, tmp_path):
    # lr 1e30: every client's model overflows, every reply is refused in every round
    experiment = prepare_experiment(compose([*TINY, "rounds=2", "lr=1e30"]))
    grid = InProcessGrid(fmnist_nodes(2))
    with pytest.raises(ConfigError, match="no round got a usable client reply"):
        run_experiment(grid, experiment, tmp_path, run_id=1)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["rounds_without_usable_reply"] == 2
    assert "NaN or infinite" in summary["reason"]
    rows = json.loads((tmp_path / "metrics.json").read_text())["rounds"]
    assert [r["rejected_partitions"] for r in rows[1:]] == ["0 1", "0 1"]
    assert [r["model_updated"] for r in rows] == [0, 0, 0]
