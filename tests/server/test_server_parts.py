"""The run directory, the console lines and the byte meter."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, Metadata, MetricRecord, RecordDict

from driftfl.common.config import compose
from driftfl.server import console
from driftfl.server.results import RunRecorder
from driftfl.server.traffic import MeteredGrid, payload_bytes


def message(records):
    meta = Metadata(run_id=1, message_id="", src_node_id=1, dst_node_id=0,
                    reply_to_message_id="", group_id="", created_at=0.0, ttl=10,
                    message_type="train")
    return Message(metadata=meta, content=RecordDict(records))


def test_payload_bytes_count_arrays_configs_and_metrics():
    msg = message({"arrays": ArrayRecord({"w": Array(np.zeros(1000, np.float32))}),
                   "config": ConfigRecord({"a": "xyz"}), "metrics": MetricRecord({"n": 1})})
    assert 4000 < payload_bytes(msg) < 4000 + 200  # 4000 bytes of weights + small headers


def test_metered_grid_passes_through_and_tallies():
    class Grid:
        def send_and_receive(self, messages, timeout=None):
            return [message({"metrics": MetricRecord({"n": 1})}) for _ in messages]

        def get_node_ids(self):
            return [1, 2]

    grid = MeteredGrid(Grid())
    out = message({"arrays": ArrayRecord({"w": Array(np.zeros(10, np.float32))})})
    replies = grid.send_and_receive([out, out], timeout=5)
    assert len(replies) == 2 and grid.get_node_ids() == [1, 2]
    taken = grid.take()
    assert taken["bytes_sent"] == 2 * payload_bytes(out)
    assert taken["bytes_received"] == 2 * payload_bytes(replies[0])
    assert grid.take() == {"bytes_sent": 0, "bytes_received": 0}


def test_recorder_writes_csv_json_plot_and_model(tmp_path):
    recorder = RunRecorder(tmp_path / "run", compose(["rounds=1"]), run_id=7)
    base = {"test_loss": 1.0, "seconds": 1.0, "train_seconds": 0.5, "eval_seconds": 0.5,
            "clients": 2, "rejected": 0, "bytes_sent": 10, "bytes_received": 10}
    recorder.add_round({"round": 0, "test_accuracy": 0.1, **base,
                        "per_class_accuracy": [0.2, math.nan]})
    recorder.add_round({"round": 1, "test_accuracy": 0.6, **base, "train_loss": 0.3,
                        "per_class_accuracy": [0.5, 0.7]})
    recorder.finish(torch.nn.Linear(2, 2), {"status": "completed"}, "title")
    run = tmp_path / "run"
    lines = (run / "metrics.csv").read_text().splitlines()
    assert lines[0].split(",")[-3:] == ["acc_class_0", "acc_class_1", "train_loss"]
    assert len(lines) == 3
    data = json.loads((run / "metrics.json").read_text())
    assert data["rounds"][0]["per_class_accuracy"] == [0.2, None]  # NaN -> null: valid JSON
    assert data["summary"]["status"] == "completed"
    assert json.loads((run / "meta.json").read_text())["flower_run_id"] == 7
    assert (run / "accuracy.png").stat().st_size > 1000 and (run / "model.pt").is_file()


def test_partition_json_follows_a_partition_to_the_node_that_took_it_back(tmp_path):
    recorder = RunRecorder(tmp_path / "run", compose(["rounds=1"]), run_id=7)
    clients = [{"node_id": 10 + p, "partition_id": p, "num_examples": 5} for p in range(3)]
    recorder.partition({"seed": 0, "clients": clients})
    path = tmp_path / "run" / "partition.json"
    assert json.loads(path.read_text()) == {"seed": 0, "clients": clients, "node_changes": []}
    recorder.clients_moved([*clients[:2], {**clients[2], "node_id": 99}], {12: 99})
    recorder.clients_moved([{**clients[0], "node_id": 77}, clients[1],
                            {**clients[2], "node_id": 99}], {10: 77})
    written = json.loads(path.read_text())
    assert [(c["partition_id"], c["node_id"]) for c in written["clients"]] == [
        (0, 77), (1, 11), (2, 99)]
    assert written["node_changes"] == [{"partition_id": 2, "from_node": 12, "to_node": 99},
                                       {"partition_id": 0, "from_node": 10, "to_node": 77}]
    # a resumed run keeps the moves made before it, and adds its own
    resumed = RunRecorder(tmp_path / "run", compose(["rounds=1"]), run_id=8, resumed={
        "rows": [], "recorded": {}, "seconds": 1.0, "round": 1})
    resumed.partition({"seed": 0, "clients": written["clients"]})
    resumed.clients_moved([{**clients[0], "node_id": 5}], {77: 5})
    assert [c["to_node"] for c in json.loads(path.read_text())["node_changes"]] == [99, 77, 5]


def test_partition_table_switches_to_top_classes_when_wide():
    narrow = console.partition_table(
        [{"partition_id": 0, "num_examples": 3, "label_histogram": [1, 2]}], ["a", "b"], "t")
    assert "     0       3     1     2" in narrow
    clients = [{"partition_id": i, "num_examples": 10, "label_histogram": [0] * 99 + [10]}
               for i in range(25)]
    wide = console.partition_table(clients, [str(i) for i in range(100)], "t")
    assert "99 (100%)" in wide and "5 more clients in partition.json" in wide


def test_partition_table_of_ten_thousand_clients_stays_short():
    clients = [{"partition_id": i, "num_examples": 6 + i % 3,
                "label_histogram": [1] * (i % 4 + 1) + [0] * (9 - i % 4)} for i in range(10_000)]
    for c in clients:
        c["label_histogram"][0] += c["num_examples"] - sum(c["label_histogram"])
    table = console.partition_table(clients, [str(i) for i in range(10)], "t").splitlines()
    assert len(table) == 2 + console.MAX_ROWS + 2
    assert table[-2].endswith("9980 more clients in partition.json")
    assert table[-1] == ("samples per client: min 6, median 7, max 8; "
                         "classes per client: min 1, median 3, max 4")


def test_a_class_or_client_the_partition_leaves_empty_is_one_warning_line():
    clients = [{"partition_id": 0, "num_examples": 5, "label_histogram": [5, 0, 0]},
               {"partition_id": 1, "num_examples": 0, "label_histogram": [0, 0, 0]},
               {"partition_id": 2, "num_examples": 4, "label_histogram": [1, 0, 3]}]
    gaps = console.coverage_gaps(clients, ["a", "b", "c"])
    assert gaps == {"classes_without_client": [1], "clients_without_sample": [1]}
    line = console.coverage_warning(gaps, ["a", "b", "c"], "pathological")
    assert line == ("driftfl: warning: the partition leaves class(es) 1 (b) held by no client: "
                    "the global model never sees them, and test accuracy on them stays 0; "
                    "client(s) 1 hold no sample (partition.assignment=covering with "
                    "num_clients x classes_per_client >= classes covers every class)")
    clients[1] = {"partition_id": 1, "num_examples": 2, "label_histogram": [0, 2, 0]}
    covered = console.coverage_gaps(clients, ["a", "b", "c"])
    assert covered == {"classes_without_client": [], "clients_without_sample": []}
    assert console.coverage_warning(covered, ["a", "b", "c"], "pathological") == ""


def test_round_line_says_about_how_long_the_rounds_to_come_take():
    rows = [{"round": 0, "seconds": 30.0}, {"round": 1, "seconds": 10.0},
            {"round": 2, "seconds": 14.0}]
    assert console.time_left(rows[:1], 5) is None  # nothing trained yet
    assert console.time_left(rows, 5) == 36.0  # 3 rounds of 12 s
    assert console.time_left(rows, 2) is None  # the last round
    line = console.round_line({"round": 2, "test_accuracy": 0.5, "test_loss": 1.0,
                               "train_seconds": 12.0, "eval_seconds": 2.0, "clients": 2,
                               "bytes_sent": 10, "bytes_received": 10, "model_updated": 1},
                              5, left=36.0)
    assert "|  train 12.0 s  eval 2.0 s  (about 36.0 s left)  |  2 clients" in line
    assert "(about 2 min 5 s left)" in console.round_line(
        {"round": 0, "test_accuracy": 0.1, "test_loss": 2.3, "train_seconds": 0.0,
         "eval_seconds": 1.0}, 5, left=125.0)


def test_round_line_shows_accuracy_time_and_traffic():
    line = console.round_line({"round": 2, "test_accuracy": 0.8512, "test_loss": 0.41,
                               "train_seconds": 12.3, "eval_seconds": 0.8, "clients": 10,
                               "bytes_sent": 3 * 1024 ** 2, "bytes_received": 1024,
                               "rejected": 1, "rejected_partitions": "7",
                               "model_updated": 1}, 5)
    assert line.startswith("round   2/5  test acc  85.12%  loss 0.4100")
    assert line.endswith("10 clients, 3.0 MB out, 1.0 KB in, 1 rejected (partitions 7)")
    row = {"round": 3, "test_accuracy": 0.1, "test_loss": 2.3, "train_seconds": 1.0,
           "eval_seconds": 0.8, "clients": 0, "bytes_sent": 10, "bytes_received": 10,
           "rejected": 2, "rejected_partitions": "0 1", "model_updated": 0}
    stuck = console.round_line(row, 5)
    assert stuck.endswith("2 rejected (partitions 0 1)  |  no usable reply: the global model "
                          "stays")
    noise = console.round_line({**row, "model_updated": 1}, 5)  # DP: the release's noise
    assert noise.endswith("no usable reply: the model moved by the release's noise alone")
    refused = console.round_line({**row, "clients": 2, "rejected": 0}, 5)
    assert refused.endswith("2 clients, 10 B out, 10 B in  |  the aggregate was refused: the "
                            "global model stays")


def test_round_line_names_dropped_lost_and_late_clients_and_the_protection():
    row = {"round": 1, "test_accuracy": 0.5, "test_loss": 1.0, "train_seconds": 1.0,
           "eval_seconds": 0.5, "clients": 7, "bytes_sent": 10, "bytes_received": 10,
           "rejected": 0, "model_updated": 1, "dropped_partitions": "3 8",
           "lost_partitions": "5", "late_partitions": "1"}
    assert console.round_line(row, 2).endswith(
        "|  7 clients, 10 B out, 10 B in, dropped: partition(s) 3 8, lost: partition(s) 5, "
        "late: partition(s) 1")
    assert "|  secagg+ 7 clients, 10 B out" in console.round_line(row, 2, secure=True)
    held = {**row, "secagg_outcome": "secure update scaled from norm 9 to 3 (...)"}
    assert console.round_line(held, 2, secure=True).endswith(
        "late: partition(s) 1, secure update scaled from norm 9 to 3 (...)")
    halted = {**held, "clients": 0, "model_updated": 0,
              "secagg_outcome": "secure aggregation halted in the setup stage: ..."}
    assert console.round_line(halted, 2, secure=True).endswith(
        "|  secure aggregation halted in the setup stage: ...: the global model stays")
    private = {**row, "epsilon": 1.234, "dp_update_norm": 0.25, "dp_noise_norm": 9.0333}
    assert console.round_line(private, 2, dp="distributed").endswith(
        "late: partition(s) 1  |  DP distributed, epsilon 1.23: update norm 0.25 (its noise "
        "alone 9.03)")
    central = {**private, "dp_median_norm": 2.0, "dp_clipped_share": 2 / 3}
    assert console.round_line(central, 2, dp="central").endswith(
        "|  DP central, epsilon 1.23: update norm 0.25 (its noise alone 9.03); 67% clipped, "
        "median norm 2 (exact, not covered by epsilon)")
    withheld = {**row, "epsilon": 1.234}  # nothing released: epsilon alone
    assert console.round_line(withheld, 2, dp="distributed").endswith(
        "|  DP distributed, epsilon 1.23")


def test_in_simulation_the_server_assigns_partitions_in_registration_order(server_task):
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.proto.node_pb2 import NodeInfo

    from driftfl.common.protocol import ASSIGNED_PARTITION, CONFIG, NUM_PARTITIONS
    from driftfl.server.simulated import AssigningGrid, assign_partitions, registration_order

    class Registry:  # Flower's engine registers nodes one after another, ids at random
        def get_nodes(self):
            return [NodeInfo(node_id=907, registered_at="2026-11-25T16:00:00.000003+00:00"),
                    NodeInfo(node_id=300, registered_at="2026-11-25T16:00:00+00:00"),
                    NodeInfo(node_id=55, registered_at="2026-11-25T16:00:00.000002+00:00"),
                    NodeInfo(node_id=12)]  # a grid that does not say: after, by id

    order = registration_order(Registry(), [12, 55, 300, 907])
    assert order == [300, 55, 907, 12]
    clients = assign_partitions(order, 3, lambda: [[1, 2], [3, 0], [0, 4]])
    assert clients == [  # the first three registered, in order; 12 holds nothing
        {"node_id": 300, "partition_id": 0, "num_examples": 3, "label_histogram": [1, 2]},
        {"node_id": 55, "partition_id": 1, "num_examples": 3, "label_histogram": [3, 0]},
        {"node_id": 907, "partition_id": 2, "num_examples": 4, "label_histogram": [0, 4]}]

    class Echo:  # replies with the message itself, one per look
        def __init__(self):
            self.pushed, self.looks = {}, 0

        def push_messages(self, messages):
            for i, message in enumerate(messages):
                message.metadata.__dict__["_message_id"] = str(i)  # as Flower's grid does
                self.pushed[str(i)] = message
            return list(self.pushed)

        def pull_messages(self, ids):
            self.looks += 1
            first = sorted(ids)[:1]
            return [Message(self.pushed[i].content, reply_to=self.pushed[i]) for i in first]

    shared = RecordDict({CONFIG: ConfigRecord({"experiment": "{}"})})  # as strategies send it
    echo = Echo()
    started = time.monotonic()
    sent = AssigningGrid(echo, clients).send_and_receive(
        [Message(shared, dst_node_id=n, message_type="train") for n in (907, 300)])
    assert echo.looks == 2 and time.monotonic() - started < 0.1  # a look 5 ms after the first
    assert [(m.content[CONFIG][ASSIGNED_PARTITION], m.content[CONFIG][NUM_PARTITIONS])
            for m in sent] == [(2, 3), (0, 3)]
    assert ASSIGNED_PARTITION not in shared[CONFIG]  # the strategy's record is left alone
    assert sent[0].content[CONFIG]["experiment"] == "{}"


def test_accuracy_png_says_what_protected_the_run(tmp_path):
    from PIL import Image

    from driftfl.server.results import plot_accuracy

    assert console.protection_note("", {}) == ""
    assert console.protection_note("secagg+", {}) == "secure aggregation: SecAgg+"
    note = console.protection_note("DP central", {"epsilon": 1.2345, "delta": 1e-5})
    assert note == "DP central: epsilon 1.23 at delta 1e-05"
    assert console.protection_note("DP distributed, secagg+", {"epsilon": None, "delta": 1e-5}
                                   ) == "DP distributed, secagg+: epsilon inf at delta 1e-05"
    rows = [{"round": r, "test_accuracy": 0.1 * r, "test_loss": 2.0 - r} for r in range(3)]
    plot_accuracy(rows, tmp_path / "accuracy.png", f"fedavg on fmnist\n{note}")
    with Image.open(tmp_path / "accuracy.png") as png:
        assert png.text["Title"] == f"fedavg on fmnist\n{note}"


def test_the_recorder_times_the_rounds_apart_from_the_start_up_and_earlier_parts(tmp_path,
                                                                                monkeypatch):
    """Round 1 is timed as every later round: the start-up (the SuperLink, Ray, the clients'
    first message) is a figure of its own; a resumed run's summary keeps its earlier parts'
    rounds apart, and its checkpoint carries them all on."""
    now = [100.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    recorder = RunRecorder(tmp_path / "run", compose(["rounds=2"]), run_id=1)
    now[0] = 130.0
    recorder.begin_rounds(startup_seconds=30.0)
    now[0] = 137.5
    assert recorder.timing() == {"seconds": 7.5, "startup_seconds": 30.0}
    assert recorder.total_seconds() == 7.5
    now[0] = 200.0
    resumed = RunRecorder(tmp_path / "run", compose(["rounds=3"]), run_id=2, resumed={
        "rows": [], "recorded": {}, "seconds": 7.5, "round": 2})
    now[0] = 220.0
    resumed.begin_rounds(startup_seconds=20.0)
    now[0] = 224.0
    assert resumed.timing() == {"seconds": 4.0, "startup_seconds": 20.0,
                                "seconds_before_resume": 7.5}
    assert resumed.total_seconds() == 11.5


def test_the_summary_line_says_the_start_up_and_a_resumed_runs_parts_apart():
    summary = {"rounds": 5, "seconds": 12.0, "startup_seconds": 40.1, "final_accuracy": 0.5,
               "best_accuracy": 0.5, "best_round": 5}
    first = console.summary_line(summary, "/runs/x").splitlines()[0]
    assert first.startswith("driftfl: 5 rounds in 12.0 s after a 40.1 s start-up; final test")
    resumed = {**summary, "seconds_before_resume": 75.0, "resumed_after_round": 3}
    assert console.summary_line(resumed, "/runs/x").startswith(
        "driftfl: rounds 4-5 in 12.0 s after a 40.1 s start-up (rounds 1-3: 1 min 15 s before "
        "the resume); final test")
    last = {**resumed, "resumed_after_round": 4}
    assert console.summary_line(last, "/runs/x").startswith(
        "driftfl: round 5 in 12.0 s after a 40.1 s start-up (rounds 1-4: ")


def test_before_round_1_a_simulation_warms_up_as_many_clients_as_run_at_once(monkeypatch,
                                                                              server_task):
    """One data-summary query each, so that Ray's workers start and load their data in the
    start-up, not in round 1's training."""
    from driftfl.common.protocol import DATA_SUMMARY
    from driftfl.server import simulated

    class Grid:
        def send_and_receive(self, messages, timeout=None):
            self.sent = list(messages)
            return []

    monkeypatch.setattr(simulated.os, "cpu_count", lambda: 4)
    clients = [{"node_id": 10 + i, "partition_id": i} for i in range(6)]
    for cpus, warmed in ((1, [10, 11, 12, 13]), (2, [10, 11]), (8, [10])):
        grid = Grid()
        simulated.warm_up(grid, clients, ConfigRecord({"experiment": "{}"}),
                          compose([f"simulation.client_cpus={cpus}"]))
        assert [m.metadata.dst_node_id for m in grid.sent] == warmed
        assert {m.metadata.message_type for m in grid.sent} == {f"query.{DATA_SUMMARY}"}


def test_round_line_says_out_of_memory_not_rejected():
    """A reply that failed for want of a resource (Ray's memory monitor killed the worker) is
    the machine's, not the client's: the round line names it so, and rejects only the rest."""
    row = {"round": 2, "test_accuracy": 0.5, "test_loss": 1.0, "train_seconds": 1.0,
           "eval_seconds": 0.1, "clients": 3, "bytes_sent": 10, "bytes_received": 10,
           "model_updated": 1, "rejected": 3, "rejected_partitions": "1 4 7",
           "failed_partitions": "4 7", "failed_for": "out of memory"}
    line = console.round_line(row, 5)
    assert line.endswith(", 1 rejected (partitions 1), failed (out of memory): partition(s) 4 7")
    only = console.round_line({**row, "rejected": 2, "rejected_partitions": "4 7"}, 5)
    assert "rejected" not in only and only.endswith("failed (out of memory): partition(s) 4 7")
