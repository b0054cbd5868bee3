"""Per-round metrics streamed as they are recorded, to watch a long run from outside.

``tracker=tensorboard`` writes TensorBoard event files to ``<run dir>/tensorboard``: every
numeric column of metrics.csv (test accuracy and loss, per-class accuracy, the clients' means,
seconds, bytes, ...) as a scalar whose step is the round. Watch with
``tensorboard --logdir outputs`` (every run under it) while the run goes on.

``tracker=mlflow`` logs to the MLflow tracking store ``MLFLOW_TRACKING_URI`` names (MLflow's
default when unset: ``mlflow.db`` in the directory `driftfl run` started in): the flattened
experiment config as the run's parameters, the same columns as metrics per round (step = round),
and at the end the summary's numbers (``summary.<key>``) and the run directory's files as
artefacts. ``<run dir>/mlflow.json`` names the MLflow run, so that a resumed run goes on in it.

``tracker=wandb``: Weights & Biases, offline by default (driftfl/server/tracker_wandb.py).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import time
import warnings
from pathlib import Path

from driftfl.common.columns import plottable
from driftfl.common.errors import ConfigError

RECORD = "mlflow.json"  # the MLflow run this run directory's rounds went to
# not artefacts: the resume state (the model and optimiser states, rewritten every round) and
# the SuperLink's log, still being written when the run ends
NOT_ARTEFACTS = {"checkpoint.pt", "superlink.log", RECORD}


class TensorBoardTracker:
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def add_round(self, flat_row: dict) -> None:
        """One round's row, its lists and dicts already flattened into columns."""
        step = int(flat_row["round"])
        for key, value in flat_row.items():
            if key != "round" and plottable(value):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()  # readable at once, not when the run ends

    def close(self) -> None:
        self.writer.close()


def quiet_mlflow() -> None:
    """MLflow's notices ("Creating initial MLflow database tables...") would come before
    driftfl's first line: its loggers show warnings and errors only. MLflow sets them up from
    this variable as it is imported (a user's own setting wins); call before importing it."""
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")


def tracking_uri() -> str:
    """The tracking store MLflow would use here (MLFLOW_TRACKING_URI, else its default in the
    current directory), as an absolute URI: the ServerApp that logs runs in another process and
    another working directory (the SuperLink's)."""
    quiet_mlflow()
    import mlflow
    from mlflow.utils.uri import resolve_uri_if_local

    uri = mlflow.get_tracking_uri()
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):  # a relative file
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).absolute())
    return resolve_uri_if_local(uri)


def mlflow_client(uri: str | None = None):
    """MLflow's client of ``uri`` (None: MLFLOW_TRACKING_URI, else MLflow's default)."""
    quiet_mlflow()
    from mlflow import MlflowClient

    with warnings.catch_warnings():  # MLflow's SQL store on SQLAlchemy 2.1: nothing to change
        warnings.filterwarnings("ignore", message="The ``noload`` loader strategy")
        return MlflowClient(uri)


def experiment_id(client) -> str:
    """The MLflow experiment runs go to (MLFLOW_EXPERIMENT_NAME, MLflow's own variable, else
    "driftfl"), created where missing: its artefact location is MLflow's default for the
    working directory of the process that creates it."""
    from mlflow.environment_variables import MLFLOW_EXPERIMENT_NAME
    from mlflow.exceptions import MlflowException

    name = MLFLOW_EXPERIMENT_NAME.get() or "driftfl"
    if found := client.get_experiment_by_name(name):
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:  # a parallel job created it first
        return client.get_experiment_by_name(name).experiment_id


def prepare_mlflow() -> str:
    """In `driftfl run`, before the launch: MLFLOW_TRACKING_URI for the processes it starts
    (tracking_uri()), and the experiment, so that a store that cannot be used is refused
    here and a new experiment keeps its artefacts in this directory (MLflow's ./mlruns), not in
    the SuperLink's. ConfigError in one line where the store cannot be used."""
    uri = tracking_uri()
    try:
        with _creating(uri):
            experiment_id(mlflow_client(uri))
    except Exception as err:  # MLflow's errors for a store it cannot open or reach vary
        raise ConfigError(f"tracker=mlflow: cannot use the MLflow tracking store {uri} "
                          f"(MLFLOW_TRACKING_URI): {str(err).splitlines()[0]}") from None
    os.environ["MLFLOW_TRACKING_URI"] = uri
    return uri


@contextlib.contextmanager
def _creating(uri: str):
    """While open, no other driftfl process prepares the same SQLite store: the parallel jobs
    of a sweep (hydra/launcher=joblib) would otherwise create a new store's tables at once,
    which MLflow's migrations refuse. A lock file per store in the temporary directory."""
    if not uri.startswith("sqlite:///"):  # a tracking server orders its own writers
        yield
        return
    import fcntl
    import hashlib
    import tempfile

    key = hashlib.sha256(uri.encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"driftfl-mlflow-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class MlflowTracker:
    """Starts its MLflow run at the first round, from what the run directory holds by then:
    config.yaml (the parameters) and meta.json (whether the run goes on after a stop)."""

    def __init__(self, run_dir: Path):
        self.dir, self.client, self.run_id = run_dir, None, None

    def _start(self) -> None:
        import yaml
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        from driftfl.report.runs import flatten

        self.client = mlflow_client()
        uri, record = self.client.tracking_uri, self.dir / RECORD
        resumed = "resumed_after_round" in json.loads((self.dir / "meta.json").read_text())
        earlier = json.loads(record.read_text()) if resumed and record.is_file() else {}
        if earlier.get("tracking_uri") == uri:  # go on in the run the earlier parts logged
            self.run_id = earlier["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            config = yaml.safe_load((self.dir / "config.yaml").read_text())
            self.run_id = self.client.create_run(
                experiment_id(self.client), run_name=config["label"],
                tags={"driftfl.run_dir": str(self.dir.absolute())}).info.run_id
            self.client.log_batch(self.run_id, params=[
                Param(key, value[:MAX_PARAM_VAL_LENGTH])
                for key, value in flatten(config).items()])
            record.write_text(json.dumps({"tracking_uri": uri, "run_id": self.run_id}) + "\n")
        atexit.register(self._end, "FAILED")  # the ServerApp ended without finishing the run
        print(f"driftfl: MLflow run {self.run_id} at {uri} (look with: mlflow ui "
              f"--backend-store-uri {uri})", flush=True)

    def add_round(self, flat_row: dict) -> None:
        from mlflow.entities import Metric

        if not self.run_id:
            self._start()
        step = int(flat_row["round"])
        stamp = int(1000 * time.time())
        self.client.log_batch(self.run_id, metrics=[
            Metric(key, float(value), stamp, step) for key, value in flat_row.items()
            if key != "round" and plottable(value)])

    def close(self) -> None:
        """The summary's numbers, the run directory's files, and the run's end."""
        from mlflow.entities import Metric

        if not self.run_id:
            self._start()
        summary_file = self.dir / "summary.json"
        summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
        stamp = int(1000 * time.time())
        self.client.log_batch(self.run_id, metrics=[
            Metric(f"summary.{key}", float(value), stamp, 0)
            for key, value in summary.items() if plottable(value)])
        for path in sorted(self.dir.iterdir()):
            if path.name in NOT_ARTEFACTS:
                continue
            if path.is_dir():
                self.client.log_artifacts(self.run_id, str(path), artifact_path=path.name)
            else:
                self.client.log_artifact(self.run_id, str(path))
        self._end("FAILED" if summary.get("status") == "failed" else "FINISHED")

    def _end(self, status: str) -> None:
        if self.run_id:
            run_id, self.run_id = self.run_id, None
            atexit.unregister(self._end)
            self.client.set_terminated(run_id, status=status)


def make_tracker(name: str, run_dir: Path):
    """The tracker ``name`` (tensorboard, mlflow, wandb) of ``run_dir``; None for none."""
    if name == "wandb":
        from driftfl.server.tracker_wandb import WandbTracker

        return WandbTracker(run_dir)
    return {"tensorboard": TensorBoardTracker, "mlflow": MlflowTracker}.get(
        name, lambda _: None)(run_dir)
