"""Tuning with Optuna (hydra/sweeper=optuna) and tracking with MLflow (tracker=mlflow): a real
`driftfl run -m` sweep of two one-round trials run at once (the joblib launcher's workers, on the
one host the sweep starts and lends them), read back with Optuna's results file and MLflow's own
client."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from conftest import driftfl_bin

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TINY = ["rounds=1", "num_clients=3", "model=mlp", "dataset.subset=2000",
        "dataset.test_subset=500"]


@pytest.mark.timeout(900)  # about 2.5 minutes on a busy 2-core machine
def test_optuna_maximises_the_final_accuracy_and_mlflow_keeps_every_trial(
        tmp_path, fmnist_available):
    """Not on the session's host: lending the sweep's own host to its workers is part of what
    is tested."""
    from mlflow import MlflowClient

    from driftfl.host import HOST_ENV

    sweep = tmp_path / "sweep"
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", HOST_ENV)}
    out = subprocess.run(
        [driftfl_bin(), "run", "-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2",
         "hydra.sweeper.n_jobs=2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
         "hydra.sweeper.direction=maximize", "hydra.sweeper.sampler.seed=0",
         "strategy=fedprox", "lr=interval(0.001,0.1)",
         "strategy.mu=tag(log,interval(0.0001,0.1))", *TINY, "tracker=mlflow",
         f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=850)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # the trials ran in two worker processes, on one start of Ray and the SuperLink
    lines = out.stdout.splitlines()
    assert lines.count("driftfl: starting Ray") == 1, out.stdout
    assert sum(line.startswith("driftfl: submitting the run") for line in lines) == 2
    assert "Ray runtime started" in (sweep / "superlink.log").read_text()
    assert not any((sweep / job / "superlink.log").exists() for job in ("0", "1"))
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    trials = {}
    for job in ("0", "1"):
        config = yaml.safe_load((sweep / job / "config.yaml").read_text())
        accuracy = json.loads((sweep / job / "summary.json").read_text())["final_accuracy"]
        trials[job] = (config["lr"], config["strategy"]["mu"], accuracy)
    best = max(trials.values(), key=lambda t: t[2])
    assert results["best_value"] == best[2]
    assert results["best_params"] == {"lr": best[0], "strategy.mu": best[1]}
    assert 0.001 <= best[0] <= 0.1 and 0.0001 <= best[1] <= 0.1
    # MLflow's default store, in the directory driftfl run started in: one run per trial
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert "MLflow run " in out.stdout and f"at {uri}" in out.stdout
    client = MlflowClient(uri)
    for job, (lr, mu, accuracy) in trials.items():
        record = json.loads((sweep / job / "mlflow.json").read_text())
        run = client.get_run(record["run_id"])
        assert run.info.status == "FINISHED"
        assert float(run.data.params["lr"]) == lr
        assert float(run.data.params["strategy.mu"]) == mu
        assert run.data.metrics["test_accuracy"] == accuracy  # the last round's
        assert run.info.artifact_uri.startswith(str(tmp_path / "mlruns"))
        assert "summary.json" in {a.path for a in client.list_artifacts(run.info.run_id)}
