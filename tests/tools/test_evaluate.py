"""`driftfl evaluate`: a run directory evaluated without overrides gives its last metrics.csv row
again, and each client's figure is what the client itself measures on its held-out share; a
model that always answers one class gives the accuracies counted by hand; bad input is one line
and exit 2, with nothing written."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
import torch

from driftfl.common.client_split import held_out_split
from driftfl.common.config import compose
from driftfl.common.datasets import load_dataset
from driftfl.evaluate import main as evaluate, run_settings
from driftfl.evaluate_output import default_out, notes
from driftfl.server.app import run_experiment
from driftfl.server.experiment import prepare_experiment
from test_methods import TINY, InProcessGrid, fmnist_nodes

SMALL = ["model=mlp", "dataset.subset=2000", "dataset.test_subset=200", "num_clients=2"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, fmnist_available):
    """A finished 1-round run of two in-process clients that hold a fifth of their data out."""
    from flwr.supercore.task_identity import TaskIdentity

    folder = tmp_path_factory.mktemp("run")
    saved = {name: getattr(TaskIdentity, name) for name in ("_run_id", "_node_id", "_task_id")}
    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):
        setattr(TaskIdentity, name, value)  # server_task's stamps, for a module-wide run
    try:
        experiment = prepare_experiment(compose([*TINY, "client_test_fraction=0.2"]))
        run_experiment(InProcessGrid(fmnist_nodes(2)), experiment, folder, run_id=1)
    finally:
        for name, value in saved.items():
            setattr(TaskIdentity, name, value)
    return folder


def last_row(folder):
    with open(folder / "metrics.csv") as f:
        return list(csv.DictReader(f))[-1]


def test_a_run_evaluated_as_it_ran_gives_its_last_rounds_accuracies(run_dir, capsys):
    evaluate([str(run_dir)])
    report = json.loads((run_dir / "evaluation.json").read_text())
    row = last_row(run_dir)
    assert report["test"]["accuracy"] == float(row["test_accuracy"])
    assert report["test"]["loss"] == pytest.approx(float(row["test_loss"]), rel=1e-9)
    assert [c["accuracy"] for c in report["test"]["classes"]] == [
        float(row[f"acc_class_{i}"]) for i in range(10)]
    assert sum(c["examples"] for c in report["test"]["classes"]) == 200
    assert [c["client"] for c in report["clients"]] == [0, 1]
    out = capsys.readouterr().out
    assert f"test accuracy {100 * float(row['test_accuracy']):.2f}%" in out
    assert f"wrote {run_dir / 'evaluation.json'}" in out


def test_each_client_scores_what_it_measured_itself_on_its_held_out_share(run_dir, tmp_path):
    """Round 1's acc_before is each client's measure of the initial model on its share: the
    same model put in model.pt gives the same figures."""
    copy = tmp_path / "initial"
    shutil.copytree(run_dir, copy)
    initial = prepare_experiment(compose([*TINY, "client_test_fraction=0.2"])).initial_model()
    torch.save(initial.state_dict(), copy / "model.pt")
    evaluate([str(copy)])
    report = json.loads((copy / "evaluation.json").read_text())
    with open(copy / "clients.csv") as f:
        measured = {int(r["client"]): float(r["acc_before"]) for r in csv.DictReader(f)
                    if r["round"] == "1"}
    assert {c["client"]: c["accuracy"] for c in report["clients"]} == measured
    held = json.loads((copy / "partition.json").read_text())["clients"]
    # a fifth held out, the rest what each client trained on (partition.json's count)
    for client, trained in zip(report["clients"], sorted(held, key=lambda c: c["partition_id"])):
        total = client["examples"] + trained["num_examples"]
        assert client["examples"] == round(0.2 * total)


def test_overrides_go_on_top_of_the_runs_own_settings(run_dir, tmp_path):
    out = tmp_path / "fewer.json"
    evaluate([str(run_dir), "dataset.test_subset=100", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["test"]["examples"] == 100 and report["overrides"] == ["dataset.test_subset=100"]
    assert report["experiment"]["client_test_fraction"] == 0.2  # the run's, not conf/'s 0
    assert report["notes"] == []  # the clients' shares are the run's own


def test_shares_other_than_the_runs_are_said_to_hold_what_it_trained_on():
    saved = compose([*TINY, "client_test_fraction=0.2"]).model_dump(mode="json")
    same = compose([*TINY, "client_test_fraction=0.2", "dataset.root=/elsewhere"])
    assert notes(same, saved) == []
    other = compose([*TINY, "client_test_fraction=0.3", "seed=3", "dataset.subset=1000"])
    (line,) = notes(other, saved)
    assert line.startswith("dataset, seed, client_test_fraction differ from the run's: ")
    assert "may hold examples it trained on" in line
    assert "a model file" in notes(same, None)[0]
    assert "client_test_fraction is 0" in notes(compose(TINY), saved)[0]


def constant_model(tmp_path, label: int):
    """An MLP whose every weight is 0 and whose head's bias favours ``label``: it answers
    ``label`` for every image."""
    model = prepare_experiment(compose(SMALL)).initial_model()
    state = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    state["head.bias"][label] = 1.0
    path = tmp_path / "model.pt"
    torch.save(state, path)
    return path


def test_a_model_that_always_answers_3_scores_the_share_of_3s(tmp_path, fmnist_available):
    path = constant_model(tmp_path, 3)
    overrides = [*SMALL, "client_test_fraction=0.25", "seed=5"]
    evaluate([str(path), *overrides])
    report = json.loads(default_out(tmp_path, overrides).read_text())  # beside the model
    data = load_dataset(compose(SMALL).dataset)
    threes = int((data.test_y == 3).sum())
    assert report["test"]["accuracy"] == threes / 200
    classes = report["test"]["classes"]
    assert classes[3] == {"class": data.classes[3], "examples": threes, "accuracy": 1.0}
    assert all(c["accuracy"] == 0.0 for i, c in enumerate(classes) if i != 3 and c["examples"])
    # each client: the share of 3s among the labels it holds out (seeded by seed=5)
    parts = prepare_experiment(compose([*SMALL, "seed=5"])).partitions()
    for client, part in zip(report["clients"], parts):
        labels = data.train_y[part]
        held = labels[held_out_split(labels, 0.25, 5, client["client"])[1]]
        assert client["examples"] == round(0.25 * len(part))
        assert client["accuracy"] == np.mean(held == 3)
    spread = report["clients_spread"]
    assert spread["best"] == max(c["accuracy"] for c in report["clients"])


def refused(capsys, *args) -> str:
    with pytest.raises(SystemExit) as stop:
        evaluate(list(args))
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("driftfl: error: ") and err.count("\n") == 1, err
    return err


def test_a_model_of_another_architecture_is_refused_in_one_line(tmp_path, capsys,
                                                                  fmnist_available):
    path = constant_model(tmp_path, 0)
    err = refused(capsys, str(path), *SMALL, "model=cnn")
    assert "is not a model=cnn for fmnist (1x28x28 images, 10 classes)" in err
    assert "give the model= and dataset= it was trained with" in err
    assert not list(tmp_path.glob("evaluation*.json"))


def test_a_pickle_is_refused_unrun(tmp_path, capsys, fmnist_available):
    path = tmp_path / "model.pt"
    torch.save({"head.bias": object()}, path)  # weights_only refuses any object
    assert "is not a model driftfl saved" in refused(capsys, str(path), *SMALL)


def test_bad_input_is_one_line_and_writes_nothing(run_dir, tmp_path, capsys):
    assert "no such run directory or model file" in refused(capsys, str(tmp_path / "no" / "none"))
    assert "name the run directory or the model.pt" in refused(capsys, "--out", "x.json")
    assert "is a sweep" in refused(capsys, str(run_dir), "seed=1,2")
    assert "not Hydra's" in refused(capsys, str(run_dir), "hydra.run.dir=x")
    assert "partition.alpha must be > 0" in refused(capsys, str(run_dir), "partition.alpha=0")
    victim = tmp_path / "victim.json"
    victim.write_text("untouched")
    (tmp_path / "link.json").symlink_to(victim)
    assert "symbolic link" in refused(capsys, str(run_dir), "--out", str(tmp_path / "link.json"))
    assert victim.read_text() == "untouched"
    empty = tmp_path / "empty-run"
    shutil.copytree(run_dir, empty, ignore=shutil.ignore_patterns("evaluation*"))
    (empty / "model.pt").unlink()
    assert "has no model.pt" in refused(capsys, str(empty))
    (empty / "config.yaml").write_text("- a list\n")
    assert "holds no settings" in refused(capsys, str(empty))
    assert not (empty / "evaluation.json").exists()


def test_a_setting_or_a_section_replaces_the_runs_own_and_nothing_else():
    saved = compose(["partition.alpha=0.3", "seed=4"]).model_dump(mode="json")
    earlier = ["partition.alpha=0.3", "seed=4"]
    assert run_settings(saved, earlier, []) == saved
    changed = run_settings(saved, earlier, ["partition.alpha=0.1"])
    assert changed["partition"]["alpha"] == 0.1 and changed["seed"] == 4
    assert {**changed, "partition": saved["partition"]} == saved
    mnist = run_settings(saved, earlier, ["dataset=mnist", "~verbose"])
    assert mnist["dataset"]["name"] == "mnist" and mnist["dataset"]["root"] is None
    assert "verbose" not in mnist  # deleted: its default again
    assert {**mnist, "dataset": saved["dataset"], "verbose": False} == saved


def test_the_default_file_names_the_overrides(tmp_path):
    assert default_out(tmp_path, []) == tmp_path / "evaluation.json"
    assert default_out(tmp_path, ["dataset.root=/a b", "seed=3"]) == (
        tmp_path / "evaluation-dataset.root=_a_b,seed=3.json")
    long = default_out(tmp_path, [f"dataset.root=/{'x' * 200}"]).name
    assert len(long) < 120 and long != default_out(tmp_path, [f"dataset.root=/{'y' * 200}"]).name
