"""How a run ended is recorded truthfully: a round without a usable reply, a client that
answers after round_timeout (late) or disconnects (lost), and a run stopped or left with fewer
than min_clients connected never end in status "completed"."""

from __future__ import annotations

import json
import logging

import pytest
from flwr.app import Error, Message

from driftfl.common.config import compose
from driftfl.common.error_replies import FEWER_AT_ONCE
from driftfl.common.errors import ConfigError
from driftfl.server.app import run_experiment
from driftfl.server.experiment import prepare_experiment
from driftfl.server.outcome import run_status, stop_reason, telling, without_reply
from test_error_replies import RAY_OOM
from test_methods import TINY, InProcessGrid, fmnist_nodes

FEWER = FEWER_AT_ONCE + "; under device=cuda, a larger simulation.client_gpus"


class FaultyGrid(InProcessGrid):
    """Deployment nodes in this process; ``faults(grid, round)`` runs before each round's
    train messages are delivered and may make nodes ``silent`` (connected, no reply within
    round_timeout) or ``gone`` (disconnected, no longer listed)."""

    def __init__(self, faults):
        super().__init__(fmnist_nodes(2))
        self.faults, self.train_round = faults, 0
        self.silent, self.gone = set(), set()

    def get_node_ids(self):
        return [n for n in super().get_node_ids() if n not in self.gone]

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == "train":
            self.train_round += 1
            self.faults(self, self.train_round)
        return super().send_and_receive(
            [m for m in messages if m.metadata.dst_node_id not in self.silent], timeout)


def run(tmp_path, faults, *overrides):
    experiment = prepare_experiment(compose([*TINY, *overrides]))
    try:
        run_experiment(FaultyGrid(faults), experiment, tmp_path, run_id=1)
    except ConfigError:
        pass
    summary = json.loads((tmp_path / "summary.json").read_text())
    return summary, json.loads((tmp_path / "metrics.json").read_text())["rounds"]


@pytest.fixture(autouse=True)
def _data(fmnist_available, server_task):
    yield


def test_a_round_in_which_every_client_was_late_leaves_the_run_incomplete(tmp_path):
    def all_late_in_round_2(grid, server_round):
        grid.silent = {100, 101} if server_round == 2 else set()

    summary, rows = run(tmp_path, all_late_in_round_2, "rounds=2")
    assert [(r["clients"], r["model_updated"]) for r in rows[1:]] == [(2, 1), (0, 0)]
    assert rows[2]["late_partitions"] == "0 1" and rows[2]["lost_partitions"] == ""
    assert summary["status"] == "incomplete" and summary["rounds_without_usable_reply"] == 1
    assert summary["reason"] == ("round(s) 2 got no usable client reply or had their aggregate "
                                 "refused (the global model learnt nothing)")
    # clients.csv says what became of each client in each round, clients.png draws it
    held = {str(c["partition_id"]): c["num_examples"] for c in json.loads(
        (tmp_path / "partition.json").read_text())["clients"]}
    assert (tmp_path / "clients.csv").read_text().splitlines() == [
        "round,client,examples,outcome", f"1,0,{held['0']},accepted", f"1,1,{held['1']},accepted",
        f"2,0,{held['0']},late", f"2,1,{held['1']},late"]
    assert (tmp_path / "clients.png").is_file()


def test_a_lost_client_below_min_clients_stops_the_run_as_failed(tmp_path):
    def partition_1_lost_in_round_1(grid, server_round):
        grid.silent = grid.gone = {101}

    summary, rows = run(tmp_path, partition_1_lost_in_round_1, "rounds=3", "min_clients=2",
                        "rejoin_wait=0")
    assert rows[1]["lost_partitions"] == "1" and rows[1]["late_partitions"] == ""
    assert [line.split(",")[3] for line in (tmp_path / "clients.csv").read_text().splitlines()
            ] == ["outcome", "accepted", "lost"]
    assert len(rows) == 2 and summary["status"] == "failed"
    assert summary["reason"].startswith("round 2: only 1 of 2 clients are connected")
    assert (tmp_path / "model.pt").is_file()


def test_a_run_that_ends_with_fewer_than_min_clients_connected_is_incomplete(tmp_path):
    def partition_1_leaves_after_replying(grid, server_round):
        grid.gone = {101}

    summary, rows = run(tmp_path, partition_1_leaves_after_replying, "rounds=1",
                        "min_clients=2")
    assert rows[1]["clients"] == 2 and summary["status"] == "incomplete"
    assert summary["reason"] == ("only 1 clients were connected after the last round, fewer "
                                 "than min_clients=2")


def test_the_status_rules():
    row = lambda r, updated: {"round": r, "model_updated": updated}  # noqa: E731
    assert run_status([row(0, 0), row(1, 1)]) == {"status": "completed"}
    assert run_status([row(0, 0), row(1, 0)], last_rejection="x")["status"] == "failed"
    assert run_status([row(0, 0), row(1, 1)], stopped="why") == {"status": "failed",
                                                                 "reason": "why"}
    assert run_status([row(0, 0), row(1, 1)], connected=3, min_clients=3) == {
        "status": "completed"}
    # under DP a round with no usable reply releases its noise alone: the model moved, and
    # learnt nothing
    noise_alone = {"round": 2, "model_updated": 1, "clients": 0}
    status = run_status([row(0, 0), {**row(1, 1), "clients": 3}, noise_alone])
    assert status["status"] == "incomplete" and status["reason"].startswith("round(s) 2 got")
    assert run_status([row(0, 0), noise_alone])["status"] == "failed"


@pytest.mark.parametrize("status, code, says", [
    ("completed", 0, ""), ("incomplete", 3, "the run is incomplete (exit code 3)"),
    ("failed", 1, "the run failed"), (None, 1, "the run did not complete (no summary.json")])
def test_driftfl_run_exit_code_tells_completed_incomplete_and_failed_apart(tmp_path, capsys,
                                                                           status, code, says):
    """A script or CI tells the outcomes apart by the exit code alone (docs/running.md)."""
    from driftfl.launch import EXIT_CODES, run_outcome

    if status:
        (tmp_path / "summary.json").write_text(json.dumps({"status": status}))
    assert run_outcome(tmp_path, [], "advice") == code
    assert EXIT_CODES.get(status or "failed") == code
    err = capsys.readouterr().err
    assert (says in err) if says else err == ""


def test_a_sweep_exits_with_its_worst_job():
    from driftfl.cli import worst

    assert worst([]) == 0
    assert worst([3, 3]) == 3
    assert worst([3, 1, 3]) == 1  # a failed job outweighs an incomplete one


class OutOfMemoryGrid(InProcessGrid):
    """Nodes in this process whose every train reply is Flower's error reply for a worker Ray
    killed for memory (its kilobytes of text)."""

    def __init__(self):
        super().__init__(fmnist_nodes(2))

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == "train":
            return [Message(Error(code=0, reason=RAY_OOM), reply_to=m) for m in messages]
        return super().send_and_receive(messages, timeout)


def test_rounds_in_a_row_that_run_out_of_memory_stop_the_run_in_one_line_each(tmp_path,
                                                                               caplog):
    experiment = prepare_experiment(compose([*TINY, "rounds=5"]))
    with caplog.at_level(logging.WARNING, logger="flwr"), \
            pytest.raises(ConfigError) as stopped:
        run_experiment(OutOfMemoryGrid(), experiment, tmp_path, run_id=1)
    summary = json.loads((tmp_path / "summary.json").read_text())
    rows = json.loads((tmp_path / "metrics.json").read_text())["rounds"]
    assert [r["round"] for r in rows] == [0, 1, 2, 3]  # the default: 3 rounds in a row
    assert [r["rejected"] for r in rows[1:]] == [2, 2, 2]
    # the machine ran out of memory: the round line says so, not that the clients were at fault
    assert {(r["failed_partitions"], r["failed_for"]) for r in rows[1:]} == {
        ("0 1", "out of memory")}
    assert summary["status"] == "failed" and str(stopped.value) == summary["reason"]
    assert summary["reason"] == (
        "stopped after round 3: rounds 1-3 got no usable client reply "
        "(max_rounds_without_reply=3); the clients' error: out of memory; run fewer clients at "
        "once (a larger simulation.client_cpus), or a smaller batch_size or model; under "
        "device=cuda, a larger simulation.client_gpus")
    # one line a round for both replies, none of Ray's text
    failed = [r.getMessage() for r in caplog.records if "failed: out of memory" in r.getMessage()]
    assert failed == ["round replies of 2 client(s) (partition 0, partition 1) failed: out of "
                      "memory; " + FEWER] * 3
    assert "Top 10 memory users" not in caplog.text and "rejected" not in caplog.text
    assert (tmp_path / "checkpoint.pt").is_file()


def test_rounds_in_a_row_without_a_reply_stop_the_run_and_say_why(tmp_path):
    def all_late(grid, server_round):
        grid.silent = {100, 101}

    summary, rows = run(tmp_path, all_late, "rounds=4", "max_rounds_without_reply=2")
    assert len(rows) == 3 and summary["status"] == "failed"
    assert summary["reason"] == (
        "stopped after round 2: rounds 1-2 got no usable client reply "
        "(max_rounds_without_reply=2); partition(s) 0 1 sent nothing back within round_timeout")


def test_a_run_set_never_to_stop_runs_every_round(tmp_path):
    def late_in_rounds_1_to_3(grid, server_round):
        grid.silent = {100, 101} if server_round <= 3 else set()

    summary, rows = run(tmp_path, late_in_rounds_1_to_3, "rounds=4",
                        "max_rounds_without_reply=0")
    assert len(rows) == 5 and rows[4]["clients"] == 2 and summary["status"] == "incomplete"


def test_the_rounds_that_end_without_a_reply():
    rows = [{"round": 0, "clients": 0}] + [{"round": r, "clients": c, "rejected": 2 - c}
                                           for r, c in enumerate([2, 0, 0], start=1)]
    assert without_reply(rows) == [2, 3] and without_reply(rows[:2]) == []
    # a round that asked nobody (an empty DP sample, every client dropped) failed no reply
    nobody = {"round": 4, "clients": 0, "rejected": 0, "late_partitions": "",
              "lost_partitions": ""}
    assert without_reply([*rows, nobody]) == []
    late = {**nobody, "late_partitions": "3"}
    assert without_reply([*rows, late]) == [2, 3, 4]
    assert stop_reason(rows, 3) == "" and stop_reason(rows, 0) == ""
    assert stop_reason(rows, 2, "partition 0 (node 1): error reply: boom").endswith(
        "(max_rounds_without_reply=2); the last round's first rejection: partition 0 (node 1): "
        "error reply: boom")


def test_the_rejection_that_tells_most_is_one_for_want_of_a_resource():
    oom = "partition 1 (node 2): error reply: out of memory (OutOfMemoryError)"
    assert telling(["partition 0 (node 1): error reply: boom", oom]) == oom
    assert telling(["partition 0 (node 1): error reply: boom"]).endswith("boom")
    assert telling([]) == ""
    row = {"round": 1, "clients": 0, "late_partitions": "", "lost_partitions": ""}
    assert run_status([{"round": 0}, {**row, "model_updated": 0}]) == {
        "status": "failed", "reason": "no round got a usable client reply, so the model never "
                                      "trained"}
