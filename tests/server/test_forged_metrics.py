"""A client's metrics live beside the server's own columns and never in them: a reply that
names a server column (the probe's test-accuracy 0.999, printed and recorded as the run's
final and best accuracy) or sends a metric of the wrong type is refused with its reason, and
the round's row keeps the server's numbers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import Message, MetricRecord, RecordDict

from driftfl.common.evaluation import evaluate
from driftfl.common.protocol import METRICS, NUM_EXAMPLES, model_to_arrays
from driftfl.server.app import RoundEvaluator, client_columns
from driftfl.server.traffic import MeteredGrid
from driftfl.strategies import FedAvg
from driftfl.strategies.parts.aggregation import read_metrics
from driftfl.strategies.base import RoundReport
from test_reply_checks import ScriptedGrid, metadata, surveyed, train_reply

CLIENTS = [{"node_id": n, "partition_id": n, "num_examples": 10} for n in (1, 2, 3)]


class Rows:
    """The RunRecorder's part that RoundEvaluator calls."""

    def __init__(self):
        self.rows = []

    def add_round(self, row):
        self.rows.append(row)

    def add_arrays(self, server_round, arrays):
        pass

    def add_images(self, images, mean, std):
        pass

    def add_clients(self, server_round, figures):
        pass


def evaluator(strategy):
    """RoundEvaluator on a 3-class, 2x2-pixel test set and a linear model."""
    rng = np.random.default_rng(0)
    data = SimpleNamespace(test_x=rng.integers(0, 256, (30, 1, 2, 2), dtype=np.uint8),
                           test_y=rng.integers(0, 3, 30), mean=[0.5], std=[0.25],
                           num_classes=3, classes=["a", "b", "c"])
    cfg = SimpleNamespace(device="cpu", eval_batch_size=16, rounds=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    made = RoundEvaluator(SimpleNamespace(cfg=cfg, data=data), model, strategy,
                          MeteredGrid(ScriptedGrid([])), Rows())
    loss, accuracy, _ = evaluate(made.model, made.x, made.y, 16, 3)
    return made, model_to_arrays(model), loss, accuracy


@pytest.fixture(autouse=True)
def _task(server_task):
    yield


def test_a_forged_test_accuracy_is_refused_and_the_row_keeps_the_servers_numbers(capsys):
    strategy = surveyed(FedAvg(), CLIENTS)
    arrays, _ = strategy.aggregate_train(1, [
        train_reply(1, [2.0, 2.0], 10, **{"train-loss": 0.5}),
        train_reply(2, [2.0, 2.0], 10, **{"train-loss": 0.5, "test-accuracy": 0.999,
                                          "test-loss": 0.0}),
        train_reply(3, [2.0, 2.0], 10, **{"train-loss": 0.5, "acc-class": [1.0, 1.0, 1.0]})])
    assert strategy.report.rejected == [
        "partition 2 (node 2): metric 'test-accuracy' would write the server's own column "
        "'test_accuracy'",
        "partition 3 (node 3): metric 'acc-class' would write the server's own column "
        "'acc_class'"]
    made, model_arrays, loss, accuracy = evaluator(strategy)
    made(1, model_arrays)
    row = made.recorder.rows[-1]
    assert row["test_accuracy"] == accuracy < 0.9 and row["test_loss"] == loss > 0
    assert row["train_loss"] == 0.5 and row["clients"] == 1 and row["rejected"] == 2
    assert f"test acc {100 * accuracy:6.2f}%" in capsys.readouterr().out


def test_the_row_never_takes_a_server_column_from_the_clients_metrics():
    """Should a forged name get past the checks (a strategy's own measurement, or a future
    path around read_metrics), the row still takes the server's numbers."""
    strategy = surveyed(FedAvg(), CLIENTS)
    strategy.report = RoundReport(clients=2, train_metrics={
        "test-accuracy": 0.999, "clients": 99.0, "bytes-sent": 0.0, "teacher-accuracy": 0.9,
        "logit-shift": 0.25})
    made, model_arrays, loss, accuracy = evaluator(strategy)
    made(1, model_arrays)
    row = made.recorder.rows[-1]
    assert row["test_accuracy"] == accuracy and row["clients"] == 2
    assert row["bytes_sent"] == 0 and row["logit_shift"] == 0.25
    assert client_columns(strategy.report, frozenset({"teacher_accuracy"})) == {
        "logit_shift": 0.25}  # a strategy's own diagnostic is its own too


def test_a_metric_of_the_wrong_type_is_refused_with_the_reply_not_a_crash(capsys):
    strategy = surveyed(FedAvg(), CLIENTS)
    arrays, _ = strategy.aggregate_train(1, [
        train_reply(1, [2.0, 2.0], 10, **{"train-loss": 0.5}),
        train_reply(2, [2.0, 2.0], 10, **{"train-loss": [0.1, 0.2]}),  # a list, not a number
        train_reply(3, [2.0, 2.0], 10, **{"train-loss": 0.5, "class-alpha": 0.5})])
    assert strategy.report.rejected == [
        "partition 2 (node 2): metric 'train-loss' is a list; expected a number",
        "partition 3 (node 3): metric 'class-alpha' is of type float; expected a list of "
        "numbers"]
    assert np.allclose(arrays["w"].numpy(), [2.0, 2.0]) and strategy.report.clients == 1
    # the same for evaluation replies, and the round is recorded and printed
    evaluation = Message(metadata=metadata(2, "evaluate"), content=RecordDict({METRICS: (
        MetricRecord({NUM_EXAMPLES: 10, "local-accuracy": [0.1, 0.9]}))}))
    honest = Message(metadata=metadata(1, "evaluate"), content=RecordDict({METRICS: (
        MetricRecord({NUM_EXAMPLES: 10, "local-accuracy": 0.5}))}))
    assert dict(strategy.aggregate_evaluate(1, [evaluation, honest])) == {"local-accuracy": 0.5}
    made, model_arrays, _, _ = evaluator(strategy)
    made(1, model_arrays)
    assert made.recorder.rows[-1]["local_accuracy"] == 0.5
    assert "round   1/2" in capsys.readouterr().out


@pytest.mark.parametrize("value, reason", [
    ("fast", "metric 'speed' is of type str; expected a number"),
    (True, "metric 'speed' is of type bool; expected a number"),
    ({"a": 1.0}, "metric 'speed' is of type dict; expected a number"),
    ([[1.0]], "metric 'speed' is a list; expected a number")])
def test_values_no_metric_record_holds_are_refused_too(value, reason):
    assert read_metrics({"speed": value}) == reason
    assert read_metrics({"class-alpha": [[1.0]]}) == (
        "metric 'class-alpha' is a list; expected a list of numbers")


@pytest.mark.parametrize("name, reason", [
    # near misses of the server's columns: not ASCII, or not of the plain shape
    ("Test-Accuracy", "metric 'Test-Accuracy' is not a name of lowercase letters, digits, - "
                      "and _ (a letter first, at most 64)"),
    ("test_acc\u0435", "metric 'test_acc\\u0435' is not named in ASCII"),  # a Cyrillic e
    ("test-accuracy\u200b", "metric 'test-accuracy\\u200b' is not named in ASCII"),
    ("test_accuracy\n", "metric 'test_accuracy\\n' is not a name of lowercase letters"),
    ("x" * 65, "is not a name of lowercase letters, digits, - and _ (a letter first, at most 64)"),
    # separators folded: one column however its '-' and '_' run
    ("test--accuracy-", "metric 'test--accuracy-' would write the server's own column "
                        "'test_accuracy'"),
    ("_clients", "metric '_clients' is not a name of lowercase letters"),
    ("dp-sigma", "metric 'dp-sigma' would write the server's own column 'dp_sigma'"),
    # another method's own columns, whichever method runs
    ("server-control-norm", "metric 'server-control-norm' would pass for "
                            "'server_control_norm', a column a strategy writes"),
    ("teacher_accuracy", "would pass for 'teacher_accuracy', a column a strategy writes"),
    ("explored-total", "would pass for 'explored_total', a column a strategy writes"),
])
def test_near_miss_and_other_methods_metric_names_are_refused_one_reason_each(name, reason):
    import driftfl.methods  # noqa: F401  (every method registered, as in a run)

    refused = read_metrics({"train-loss": 0.5, name: 1.0})
    assert isinstance(refused, str) and reason in refused, refused
    strategy = surveyed(FedAvg(), CLIENTS)
    strategy.aggregate_train(1, [train_reply(1, [2.0, 2.0], 10, **{name: 0.5})])
    assert strategy.report.rejected == [f"partition 1 (node 1): {refused}"]


@pytest.mark.parametrize("value, reason", [
    (1.7e308, "metric 'train-loss' is 1.7e+308, over 1e+12 in magnitude"),
    (-1e13, "metric 'train-loss' is -1e+13, over 1e+12 in magnitude")])
def test_metric_values_are_bounded_in_magnitude(value, reason):
    assert read_metrics({"train-loss": value}) == reason
    assert read_metrics({"class-alpha": [0.5, float("nan"), value]}) == (
        "metric 'class-alpha' holds a value over 1e+12 in magnitude")
    assert read_metrics({"train-loss": 1e12, "class-alpha": [-1e12, float("nan")]}) \
        == {"train-loss": 1e12, "class-alpha": [-1e12, pytest.approx(float("nan"), nan_ok=True)]}


def test_every_metric_a_methods_clients_send_is_accepted():
    """The names the clients here send, DCFL's own figures (columns its strategy records by
    client) among them."""
    import driftfl.methods  # noqa: F401
    from driftfl.common.protocol import (CLASS_ALPHA, CONDENSE_EPSILON, CONDENSE_SECONDS,
                                         CONDENSED_COPIES, CONDENSED_SIMILARITY, LOCAL_STEPS,
                                         TRAIN_LOSS)
    from driftfl.common.client_split import ACC_AFTER, ACC_BEFORE

    sent = [NUM_EXAMPLES, LOCAL_STEPS, TRAIN_LOSS, ACC_BEFORE, ACC_AFTER, "logit-shift",
            "local-loss", "local-accuracy", "control-norm", "fisher-mean", "grad-prev-norm",
            "alpha-mean", "moon-previous-model", "mask-filter-rate", "teacher-logits-reused",
            "global-prototype-classes", CONDENSE_SECONDS, CONDENSE_EPSILON, CONDENSED_COPIES,
            CONDENSED_SIMILARITY]
    assert read_metrics({name: 1.0 for name in sent} | {CLASS_ALPHA: [0.5]}) == (
        {name: 1.0 for name in sent} | {CLASS_ALPHA: [0.5]})
