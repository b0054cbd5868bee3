"""tracker=mlflow: the run recorder's parameters, per-round metrics and artefacts, read back
with MLflow's own client from a real tracking store."""

from __future__ import annotations

import csv
import json
import math
import os

import pytest
import torch

pytest.importorskip("mlflow")
# MLflow's SQL store on SQLAlchemy 2.1, when the test reads back with its own client
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy")

from mlflow import MlflowClient  # noqa: E402

from driftfl.common.config import compose  # noqa: E402
from driftfl.server.results import RunRecorder  # noqa: E402
from driftfl.common.errors import ConfigError  # noqa: E402
from driftfl.server.tracker import (  # noqa: E402
    RECORD, prepare_mlflow, tracking_uri)

BASE = {"test_loss": 1.0, "seconds": 1.0, "train_seconds": 0.5, "eval_seconds": 0.5,
        "clients": 2, "rejected": 0, "bytes_sent": 10, "bytes_received": 10}


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    """One store for the module: a new one's tables take seconds to create."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def store(database, tmp_path, monkeypatch, request):
    """The store, prepared as `driftfl run` prepares it in the directory it starts in
    (``user``), with an MLflow experiment of the test's own (MLflow's variable names it);
    then the test goes on where the ServerApp runs (``superlink``)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", database)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", request.node.name)
    for folder in ("user", "superlink"):
        (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path / "user")
    assert prepare_mlflow() == database
    monkeypatch.chdir(tmp_path / "superlink")
    return database


def record(run_dir, rounds, resumed=None, accuracies=(0.1, 0.4, 0.6)):
    recorder = RunRecorder(run_dir, compose(["tracker=mlflow", "strategy=fedprox",
                                             f"rounds={rounds}"]), run_id=1, resumed=resumed)
    first = resumed["round"] + 1 if resumed else 0
    for r in range(first, rounds + 1):
        recorder.add_round({"round": r, "test_accuracy": accuracies[r], **BASE,
                            "per_class_accuracy": [accuracies[r], math.nan]})
    return recorder


def test_a_run_logs_its_config_every_rounds_metrics_and_its_files(tmp_path, store, capsys,
                                                                  request):
    run_dir = tmp_path / "run"
    recorder = record(run_dir, rounds=2)
    recorder.finish(torch.nn.Linear(2, 2), {"status": "completed", "final_accuracy": 0.6,
                                            "best_accuracy": 0.6}, "title")
    client = MlflowClient(store)
    run = client.get_run(json.loads((run_dir / RECORD).read_text())["run_id"])
    assert client.get_experiment(run.info.experiment_id).name == request.node.name
    assert run.info.status == "FINISHED" and run.info.run_name == "fedprox"
    assert run.data.params["strategy.name"] == "fedprox"
    assert run.data.params["strategy.mu"] == "0.01" and run.data.params["rounds"] == "2"
    assert run.data.tags["driftfl.run_dir"] == str(run_dir)
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for column in ("test_accuracy", "test_loss", "acc_class_0", "bytes_sent"):
        history = client.get_metric_history(run.info.run_id, column)
        assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [
            (int(row["round"]), float(row[column])) for row in rows]
    assert run.data.metrics["summary.final_accuracy"] == 0.6
    logged = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "metrics.csv", "summary.json", "accuracy.png",
            "model.pt"} <= logged
    assert "checkpoint.pt" not in logged
    # the artefacts are kept where driftfl run was started, not in the ServerApp's directory
    assert run.info.artifact_uri.startswith(str(tmp_path / "user" / "mlruns"))
    assert not any((tmp_path / "superlink").iterdir())
    assert f"MLflow run {run.info.run_id} at {store}" in capsys.readouterr().out


def test_a_resumed_run_goes_on_in_the_mlflow_run_it_started(tmp_path, store):
    run_dir = tmp_path / "run"
    first = record(run_dir, rounds=1)
    run_id = first.tracker.run_id
    first.tracker._end("FAILED")  # the first part stopped: its ServerApp's exit ends it
    again = record(run_dir, rounds=2, resumed={"rows": list(first.rows), "recorded": {},
                                                "seconds": 1.0, "round": 1})
    again.finish(torch.nn.Linear(2, 2), {"status": "completed"}, "title")
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name(
        "test_a_resumed_run_goes_on_in_the_mlflow_run_it_started")
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [run_id]
    history = client.get_metric_history(run_id, "test_accuracy")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.1), (1, 0.4), (2, 0.6)]
    assert client.get_run(run_id).info.status == "FINISHED"


def test_a_failed_run_is_marked_failed(tmp_path, store):
    recorder = record(tmp_path / "run", rounds=1)
    recorder.finish(torch.nn.Linear(2, 2), {"status": "failed", "reason": "no reply"}, "t")
    run_id = json.loads((tmp_path / "run" / RECORD).read_text())["run_id"]
    assert MlflowClient(store).get_run(run_id).info.status == "FAILED"


@pytest.mark.parametrize("given, expected", [
    (None, "sqlite:///{cwd}/mlflow.db"),  # MLflow's default, in the directory driftfl ran in
    ("mlruns", "{cwd}/mlruns"),
    ("file:./mlruns", "file://{cwd}/mlruns"),
    ("sqlite:///runs.db", "sqlite:///{cwd}/runs.db"),
    ("sqlite:////elsewhere/runs.db", "sqlite:////elsewhere/runs.db"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
])
def test_the_tracking_uri_is_made_absolute_where_driftfl_runs(tmp_path, monkeypatch, given,
                                                               expected):
    monkeypatch.chdir(tmp_path)
    if given is None:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", given)
    assert tracking_uri() == expected.format(cwd=tmp_path)


def test_a_store_that_cannot_be_used_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuch://host/path")
    with pytest.raises(ConfigError) as refused:
        prepare_mlflow()
    assert str(refused.value).startswith(
        "tracker=mlflow: cannot use the MLflow tracking store nosuch://host/path")
    assert "\n" not in str(refused.value)


def test_a_new_store_is_prepared_without_mlflows_notices(tmp_path):
    """`driftfl run tracker=mlflow` on a new store: no "INFO mlflow.store.db.utils: Creating
    initial MLflow database tables..." before driftfl's first line. A fresh interpreter: MLflow
    sets its loggers up as it is imported, once per process (this module has imported it)."""
    import subprocess
    import sys

    from conftest import REPO

    prepared = subprocess.run(
        [sys.executable, "-c", "from driftfl.server.tracker import prepare_mlflow; "
                               "print(prepare_mlflow())"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO),
             "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'new.db'}"})
    assert prepared.returncode == 0, prepared.stderr
    assert prepared.stdout == f"sqlite:///{tmp_path / 'new.db'}\n" and prepared.stderr == ""
    assert (tmp_path / "new.db").is_file()
