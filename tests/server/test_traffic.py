"""The byte meter by payload kind: MeteredGrid over real Flower messages, the row's columns, the
CSV and `driftfl report`'s payload table."""

from __future__ import annotations

import json

import numpy as np
import yaml
from flwr.app import (Array, ArrayRecord, ConfigRecord, Error, Message, MessageType,
                      MetricRecord, RecordDict)

from driftfl.common.columns import forged_column
from driftfl.common.config import compose
from driftfl.common.protocol import (ARRAYS, CONFIG, CSD_PROTOTYPES, DATA_SUMMARY, FISHER,
                                     LABEL_HISTOGRAM, METRICS, PROTOTYPES, TEACHER)
from driftfl.report import main as report
from driftfl.server.results import RunRecorder
from driftfl.server.traffic import MeteredGrid, payload_bytes, record_bytes


def arrays(n: int) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros(n, np.float32))})


class RepliesGrid:
    """A Grid whose nodes answer each message with ``answer(message)``."""

    def __init__(self, answer):
        self.answer = answer

    def send_and_receive(self, messages, timeout=None):
        return [self.answer(m) for m in messages]


def size(record) -> int:
    return record.count_bytes()


def test_each_payload_kinds_bytes_per_round_match_what_the_messages_carried(server_task):
    model, teacher = arrays(1000), arrays(1000)
    config = ConfigRecord({"server-round": 1, "experiment": "{...}"})
    prototypes = ArrayRecord({"prototypes": Array(np.zeros((10, 10), np.float32)),
                              "counts": Array(np.zeros(10, np.int64))})
    fisher, metrics = arrays(1000), MetricRecord({"num-examples": 5, "train-loss": 0.5})
    histogram = MetricRecord({"partition-id": 0, "num-examples": 3, LABEL_HISTOGRAM: [1, 2]})

    def answer(msg: Message) -> Message:
        if msg.metadata.dst_node_id == 3:  # a failed node: an error reply carries nothing
            return Message(Error(code=0, reason="boom"), reply_to=msg)
        if msg.metadata.message_type.endswith(DATA_SUMMARY):
            return Message(RecordDict({METRICS: histogram}), reply_to=msg)
        if msg.metadata.message_type.endswith(CSD_PROTOTYPES):
            return Message(RecordDict({PROTOTYPES: prototypes, METRICS: metrics}), reply_to=msg)
        # a client naming its own record: counted, as "other", never as a column of its name
        return Message(RecordDict({ARRAYS: model, METRICS: metrics, FISHER: fisher,
                                   "x,y\nz": arrays(7)}), reply_to=msg)

    grid = MeteredGrid(RepliesGrid(answer))
    survey = [Message(RecordDict({CONFIG: config}), dst_node_id=node,
                      message_type=f"{MessageType.QUERY}.{DATA_SUMMARY}") for node in (1, 2)]
    grid.send_and_receive(survey)
    assert grid.take() == {"bytes_sent": 2 * size(config), "bytes_received": 2 * size(histogram),
                           "bytes_down_survey": 2 * size(config),
                           "bytes_up_survey": 2 * size(histogram)}

    # a round: a prototype phase (a query) to two nodes, then train to three, one failing
    query = [Message(RecordDict({TEACHER: teacher, CONFIG: config}), dst_node_id=node,
                     message_type=f"{MessageType.QUERY}.{CSD_PROTOTYPES}") for node in (1, 2)]
    grid.send_and_receive(query, timeout=5)
    train = [Message(RecordDict({ARRAYS: model, CONFIG: config, TEACHER: teacher,
                                 PROTOTYPES: prototypes}), dst_node_id=node,
                     message_type=MessageType.TRAIN) for node in (1, 2, 3)]
    grid.send_and_receive(train, timeout=5)
    row = grid.take()
    assert row == {
        "bytes_sent": sum(payload_bytes(m) for m in query + train),
        "bytes_received": 2 * (size(prototypes) + size(metrics))
        + 2 * (size(model) + size(metrics) + size(fisher) + size(arrays(7))),
        "bytes_down_arrays": 3 * size(model), "bytes_down_config": 5 * size(config),
        "bytes_down_prototypes": 3 * size(prototypes), "bytes_down_teacher": 5 * size(teacher),
        "bytes_up_arrays": 2 * size(model), "bytes_up_fisher": 2 * size(fisher),
        "bytes_up_metrics": 4 * size(metrics), "bytes_up_other": 2 * size(arrays(7)),
        "bytes_up_prototypes": 2 * size(prototypes)}
    assert size(model) >= 4000 and size(prototypes) >= 10 * 10 * 4 + 10 * 8  # the payloads
    assert grid.take() == {"bytes_sent": 0, "bytes_received": 0}  # taken: the next round's


def test_record_bytes_name_kinds_column_safe(server_task):
    reply = Message(RecordDict({"feature-prototypes": arrays(3), "control-delta": arrays(2)}),
                    dst_node_id=1, message_type=MessageType.TRAIN)
    assert set(record_bytes(reply)) == {"feature_prototypes", "control_delta"}


def test_no_client_metric_can_write_a_byte_column():
    for metric in ("bytes-up-arrays", "bytes_down_teacher", "bytes-up-survey", "bytes-sent"):
        assert forged_column(metric)


def test_the_csv_has_0_for_a_payload_kind_a_round_did_not_send(tmp_path):
    recorder = RunRecorder(tmp_path / "run", compose(["rounds=2"]), run_id=1)
    base = {"test_loss": 1.0, "clients": 2, "bytes_sent": 10, "bytes_received": 10}
    recorder.add_round({"round": 0, "test_accuracy": 0.1, **base, "bytes_up_survey": 10})
    recorder.add_round({"round": 1, "test_accuracy": 0.5, **base, "bytes_up_arrays": 10})
    lines = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert lines[0].endswith("bytes_up_survey,bytes_up_arrays")
    assert lines[1].endswith(",10,0") and lines[2].endswith(",0,10")


def write_run(folder, label, rounds, seed=0):
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"label": label, "seed": seed,
                                                        "num_clients": 2}))
    (folder / "metrics.json").write_text(json.dumps({"rounds": rounds}))
    (folder / "summary.json").write_text(json.dumps({"status": "completed"}))


def row(r: int, **bytes_by_kind) -> dict:
    return {"round": r, "test_accuracy": 0.5, "seconds": 1.0, "clients": 2,
            "bytes_sent": 0, "bytes_received": 0, **bytes_by_kind}


def test_report_shows_each_payload_kind_per_client_and_round(tmp_path, capsys):
    kb = 1024
    write_run(tmp_path / "a0", "fedcurv", [
        row(0, bytes_up_survey=2 * kb),
        row(1, bytes_down_arrays=4 * kb, bytes_up_arrays=4 * kb),
        row(2, bytes_down_arrays=4 * kb, bytes_up_arrays=4 * kb, bytes_up_fisher=8 * kb)])
    write_run(tmp_path / "a1", "fedcurv", [
        row(0, bytes_up_survey=2 * kb),
        row(1, bytes_down_arrays=4 * kb, bytes_up_arrays=4 * kb, bytes_up_fisher=4 * kb)], seed=1)
    write_run(tmp_path / "b", "old", [row(0), row(1)])  # written before bytes by kind
    report([str(tmp_path)])
    out = capsys.readouterr().out
    assert "| label | payload | KB / client / round down | KB / client / round up |" in out
    assert "| fedcurv | arrays | 2.00 ± 0.00 | 2.00 ± 0.00 |" in out
    # run a0: (0 + 4) / 2 per round; a1: 4 / 2
    assert "| fedcurv | fisher | 0.00 ± 0.00 | 2.00 ± 0.00 |" in out
    assert "| fedcurv | survey (once, before round 1) | 0.00 ± 0.00 | 1.00 ± 0.00 |" in out
    assert "| old |" not in out.split("| label | payload")[1]
    assert "1 row(s) hold runs that count bytes only in all" in out
    assert (tmp_path / "payloads.csv").is_file()
