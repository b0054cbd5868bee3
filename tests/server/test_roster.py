"""Deployment's roster: a lost client is waited for once, the run goes on with the clients
that are left (or stops with one line when fewer than min_clients remain), and a restarted
node is surveyed and takes its partition back. Lost replies are counted by partition."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message, Metadata, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

from driftfl.common.config import compose
from driftfl.common.errors import ConfigError
from driftfl.common.protocol import DATASET_META
from driftfl.server.federation import DeployedFederation
from driftfl.server.roster import Roster
from driftfl.strategies import FedAvg
from test_reply_checks import (GLOBAL, META, ScriptedGrid, summary_reply, surveyed,
                               train_reply)

CLIENTS = [{"node_id": 10 + p, "partition_id": p, "num_examples": 5,
            "label_histogram": [2, 3, 0]} for p in range(3)]


class ChangingGrid(ScriptedGrid):
    """Nodes that come and go: ``connected`` is what Flower lists as online now."""

    def __init__(self, connected, replies=()):
        super().__init__(list(replies))
        self.connected = list(connected)
        self.asked = []

    def get_node_ids(self):
        return self.connected

    def send_and_receive(self, messages, timeout=None):
        asked = [m.metadata.dst_node_id for m in messages]
        self.asked += asked
        return [r for r in self.replies if r.metadata.src_node_id in asked]


@pytest.fixture(autouse=True)
def _task(server_task):  # the roster's survey creates messages
    yield


def roster(grid, min_clients=1, rejoin_wait=0.0):
    met = []
    made = Roster(grid, ConfigRecord({DATASET_META: META}), CLIENTS, num_partitions=3,
                  min_clients=min_clients, rejoin_wait=rejoin_wait, timeout=5,
                  on_change=lambda clients, moved: met.append((clients, moved)), poll=0.01)
    return made, met


def test_the_run_goes_on_with_the_clients_left_after_waiting_once(capsys):
    grid = ChangingGrid([10, 11])
    clients, met = roster(grid, rejoin_wait=0.2)
    assert clients.nodes(3) == [10, 11]
    out = capsys.readouterr().out
    assert "round 3: partition 2 did not come back within rejoin_wait=0.2 s" in out
    assert "round 3: going on with 2 of 3 clients; partition 2 missing" in out
    assert clients.nodes(4) == [10, 11]  # no second wait, no repeated line
    assert capsys.readouterr().out == "" and met == [] and grid.asked == []


def test_too_few_clients_left_stop_the_run_with_one_line():
    clients, _ = roster(ChangingGrid([11]), min_clients=2)
    with pytest.raises(ConfigError, match=r"round 5: only 1 of 3 clients are connected "
                                          r"\(partition 0, partition 2 lost\), fewer than "
                                          r"min_clients=2; restart their SuperNodes"):
        clients.nodes(5)


def test_a_restarted_node_is_surveyed_and_takes_its_partition_back(capsys):
    grid = ChangingGrid([10, 11, 99], [summary_reply(99, 2, 5, [1, 1, 3])])
    clients, met = roster(grid)
    assert clients.nodes(3, lost=[12]) == [10, 11, 99]
    out = capsys.readouterr().out
    assert grid.asked == [99] and "partition 2 rejoined as node 99" in out
    assert "is back" not in out  # a new node id: rejoined, said once
    clients_now, moved = met[-1]
    assert [(c["partition_id"], c["node_id"]) for c in clients_now] == [(0, 10), (1, 11), (2, 99)]
    assert moved == {12: 99}  # state kept by node id follows the partition
    clients.nodes(4)
    assert grid.asked == [99]  # a node is surveyed once


def test_a_newcomer_cannot_take_a_partition_a_connected_node_holds():
    grid = ChangingGrid([10, 11, 12, 99], [summary_reply(99, 1, 5, [1, 1, 3])])
    clients, met = roster(grid)
    assert clients.nodes(2) == [10, 11, 12] and met == []
    assert clients.nodes(3) == [10, 11, 12] and grid.asked == [99]  # refused once, not again


def superlink_error(reply_to="m"):
    """Flower's error reply for a lost node: from the SuperLink's own node id, in reply to the
    message sent to that node."""
    return Message(metadata=Metadata(run_id=1, message_id="", src_node_id=SUPERLINK_NODE_ID,
                                     dst_node_id=SUPERLINK_NODE_ID, reply_to_message_id=reply_to,
                                     group_id="", created_at=0.0, ttl=10, message_type="train"),
                   error=Error(code=ErrorCode.NODE_UNAVAILABLE, reason="unavailable"))


def sent_train_messages(strategy, nodes):
    """The round's train messages, given their ids as the grid does when it pushes them."""
    strategy.trained = list(nodes)
    strategy.train_messages = [Message(RecordDict(), dst_node_id=n, message_type="train")
                               for n in nodes]
    for m in strategy.train_messages:
        m.metadata.__dict__["_message_id"] = f"sent-to-{m.metadata.dst_node_id}"


def deployed(grid, min_clients=1):
    """A deployed federation over ``grid`` whose clients are CLIENTS, its roster started."""
    federation = DeployedFederation(grid, compose([f"min_clients={min_clients}",
                                                   "rejoin_wait=0", "num_clients=3"]))
    federation.start(CLIENTS, Path("run"), ConfigRecord({DATASET_META: META}),
                     lambda clients, moved: None)
    return federation


def test_a_node_that_sent_nothing_back_and_disconnected_is_lost_not_rejected_and_not_used(
        capsys):
    strategy = surveyed(FedAvg(), CLIENTS)
    sent_train_messages(strategy, [10, 11, 12])
    federation = deployed(ChangingGrid([10, 11]))
    updates = strategy.accept([train_reply(10, [2.0, 2.0], 5), train_reply(11, [1.0, 3.0], 5),
                               superlink_error()])
    federation.settle(strategy)
    assert [u.node_id for u in updates] == [10, 11]
    assert strategy.report.lost == ["2"] and strategy.report.lost_nodes == [12]
    assert strategy.report.rejected == [] and strategy.report.late == []
    assert np.array_equal(strategy.global_arrays["w"], GLOBAL["w"])
    assert federation.lost == [12]  # the roster waits for it before the next round


def test_a_superlink_error_is_reported_as_the_superlinks_not_as_late(caplog):
    """The SuperLink's own error (its database locked) for the message sent to node 12 was
    counted as silence, so node 12 was "late" (issue 52): it is named as what it is, no
    offence of the node's."""
    from driftfl.strategies.round_report import superlink_failures

    locked = Message(metadata=superlink_error("sent-to-12").metadata,
                     error=Error(code=ErrorCode.UNKNOWN, reason="database is locked"))
    strategy = surveyed(FedAvg(), CLIENTS)
    sent_train_messages(strategy, [10, 11, 12])
    assert superlink_failures([locked], strategy.train_messages) == {
        12: "the SuperLink failed: database is locked"}
    federation = deployed(ChangingGrid([10, 11, 12]))
    with caplog.at_level("WARNING", logger="flwr"):
        updates = strategy.accept([train_reply(10, [2.0, 2.0], 5),
                                   train_reply(11, [1.0, 3.0], 5), locked])
        federation.settle(strategy)
    report = strategy.report
    assert [u.node_id for u in updates] == [10, 11]
    assert report.late == [] and report.lost == [] and report.offenders == []
    assert report.failed == [("2", "the SuperLink failed: database is locked")]
    assert "failed: the SuperLink failed: database is locked" in caplog.text
    assert "late" not in caplog.text


def test_the_superlinks_error_reply_names_a_lost_node_that_is_connected_again():
    """An authenticated node that died mid-round and came back under its id before the round
    ended: only the SuperLink's error reply, in reply to the message sent to it, tells."""
    strategy = surveyed(FedAvg(), CLIENTS)
    sent_train_messages(strategy, [10, 11, 12])
    federation = deployed(ChangingGrid([10, 11, 12]))
    strategy.accept([train_reply(10, [2.0, 2.0], 5), superlink_error("sent-to-11")])
    federation.settle(strategy)
    assert strategy.report.lost == ["1"] and strategy.report.late == ["2"]


def test_a_connected_node_over_round_timeout_is_late_not_lost_and_never_back(capsys):
    """The probe's node slept past round_timeout: it was recorded lost, and the roster then
    said "partition 2 is back" though it never disconnected."""
    strategy = surveyed(FedAvg(), CLIENTS)
    grid = ChangingGrid([10, 11, 12])
    federation = deployed(grid)
    sent_train_messages(strategy, [10, 11, 12])
    updates = strategy.accept([train_reply(10, [2.0, 2.0], 5), train_reply(11, [1.0, 3.0], 5)])
    federation.settle(strategy)
    assert [u.node_id for u in updates] == [10, 11]
    assert strategy.report.late == ["2"] and strategy.report.lost == []
    federation.begin_round(2)
    assert strategy.available(2, federation.grid) == [10, 11, 12]  # still a client
    assert "is back" not in capsys.readouterr().out and "missing" not in \
        capsys.readouterr().out


def test_in_simulation_a_missing_reply_is_late():
    strategy = surveyed(FedAvg(), CLIENTS)  # no federation: nodes are never lost
    sent_train_messages(strategy, [10, 11])
    strategy.accept([train_reply(10, [2.0, 2.0], 5)])
    assert strategy.report.late == ["1"] and strategy.report.lost_nodes == []


def test_the_rounds_nodes_are_the_rosters_and_the_strategy_samples_only_them():
    """The federation's grid offers the strategy the round's connected clients: a lost one
    is not sampled, whatever Flower still lists."""
    grid = ChangingGrid([10, 11])
    federation = deployed(grid)
    federation.begin_round(3)
    strategy = surveyed(FedAvg(), CLIENTS)
    assert federation.grid.get_node_ids() == [10, 11]
    assert strategy.available(3, federation.grid) == [10, 11]
    with pytest.raises(ConfigError, match="fewer than min_clients=3"):
        deployed(ChangingGrid([10]), min_clients=3).begin_round(4)


def test_a_client_whose_node_id_connects_again_is_back_without_a_new_survey(capsys):
    """With node authentication a restarted SuperNode keeps its node id (it is its key's):
    the client is back as it was, with nothing to survey, whether Flower listed it as gone
    before the next round or it was back already (only its lost reply tells)."""
    grid = ChangingGrid([10, 11])
    clients, met = roster(grid)
    assert clients.nodes(2) == [10, 11]
    grid.connected = [10, 11, 12]
    assert clients.nodes(3) == [10, 11, 12]
    assert "round 3: partition 2 is back (node 12)" in capsys.readouterr().out
    assert clients.nodes(4, lost=[11]) == [10, 11, 12]  # restarted within the round
    assert "round 4: partition 1 is back (node 11)" in capsys.readouterr().out
    assert grid.asked == [] and met == []  # no survey, no partition moved
    assert clients.nodes(5) == [10, 11, 12] and "is back" not in capsys.readouterr().out
