"""What every strategy shares: reproducible client sampling and the train message."""

from __future__ import annotations

import pytest
from flwr.app import ArrayRecord, ConfigRecord

from driftfl.common.config import compose
from driftfl.common.errors import ConfigError
from driftfl.common.protocol import ARRAYS, CONFIG, METHOD, PROXIMAL_MU, SERVER_ROUND
from driftfl.methods import build_strategy, check_experiment
from driftfl.strategies import FedAvg, Selection
from driftfl.server.nodes import wait_for_nodes


class FakeGrid:
    def __init__(self, node_ids):
        self.node_ids = list(node_ids)

    def get_node_ids(self):
        return list(self.node_ids)


def sampled_partitions(node_ids, seed, server_round, fraction=0.3):
    strategy = FedAvg(selection=Selection(seed=seed), fraction_train=fraction, min_train_nodes=1,
                      min_available_nodes=1)
    strategy.clients.node_rank = {node: rank for rank, node in enumerate(node_ids)}
    chosen = strategy.sample(server_round, FakeGrid(reversed(node_ids)))
    return [strategy.clients.node_rank[n] for n in chosen]


def test_seed_and_round_fix_the_sampled_partitions_whatever_the_node_ids():
    a = sampled_partitions([11, 52, 3, 94, 25, 6, 71, 8, 19, 10], seed=0, server_round=3)
    b = sampled_partitions([101, 202, 303, 404, 505, 606, 707, 808, 909, 1000], seed=0,
                           server_round=3)
    assert a == b and len(a) == 3
    rounds = {tuple(sampled_partitions(list(range(10)), seed=0, server_round=r))
              for r in range(1, 8)}
    assert len(rounds) > 1  # different rounds, different clients
    assert sampled_partitions(list(range(10)), 1, 3) != a or \
        sampled_partitions(list(range(10)), 2, 3) != a  # the seed matters


@pytest.mark.parametrize("fraction, nodes, expected", [(1.0, 10, 10), (0.25, 20, 5),
                                                      (0.29, 100, 29), (0.05, 10, 1)])
def test_fraction_of_nodes_with_at_least_one(fraction, nodes, expected):
    assert len(sampled_partitions(list(range(nodes)), 0, 1, fraction)) == expected


def test_train_messages_carry_model_config_and_objective(server_task):
    cfg = check_experiment(compose(["strategy=fedprox", "strategy.mu=0.3", "num_clients=2"]))
    strategy = build_strategy(cfg, None)
    messages = list(strategy.configure_train(4, ArrayRecord(), ConfigRecord({"x": 1}),
                                             FakeGrid([5, 6])))
    assert sorted(m.metadata.dst_node_id for m in messages) == [5, 6]
    config = messages[0].content[CONFIG]
    assert config[SERVER_ROUND] == 4 and config[METHOD] == "prox" and config["x"] == 1
    assert config[PROXIMAL_MU] == 0.3  # strategy.mu, as Flower's FedProx sends it
    assert ARRAYS in messages[0].content.array_records


def test_waiting_for_nodes_gives_up_with_advice():
    with pytest.raises(ConfigError, match=r"only 2 of num_clients=5.*num_supernodes"):
        wait_for_nodes(FakeGrid([1, 2]), 5, timeout=0.1, every=100)
