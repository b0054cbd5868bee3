"""The ServerApp: compose the experiment, survey the clients' data, run the strategy with
central evaluation after every round, and write the run directory."""

from __future__ import annotations

import copy
import logging
import os
import random
import time
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from driftfl.common.blas import one_blas_thread
from driftfl.common import paths
from driftfl.common.client_split import ACC_AFTER, ACC_BEFORE
from driftfl.common.columns import column, forged_column
from driftfl.common.config import compose
from driftfl.common.datasets import to_tensors
from driftfl.common.error_replies import quiet_flower_errors
from driftfl.common.errors import ConfigError
from driftfl.common.evaluation import evaluate
from driftfl.common.partition import describe
from driftfl.common.protocol import (DATASET_META, EXPERIMENT, load_arrays, load_numpy,
                                     model_to_arrays)
from driftfl.methods import build_strategy
from driftfl.strategies import DriftStrategy
from driftfl.strategies.parts.aggregation import to_numpy, to_record
from driftfl.strategies.parts.bounded import trust_line

from . import checkpoint, console, ledger
from .client_eval import client_figures, client_rows, spread_columns
from .experiment import Experiment, prepare_experiment
from .federation import Federation
from .progress import Progress
from .results import RunRecorder
from .run_config import experiment_overrides
from .outcome import RunStopped, learned, run_status, stop_reason, telling
from .rounds import run_rounds
from .secure import check_weights
from .traffic import MeteredGrid

app = ServerApp()


class ExperimentRefused(Exception):
    """The experiment cannot run as configured (the reason was printed just before)."""


def _without_refusal_traceback(record: logging.LogRecord) -> bool:
    """Flower logs the ServerApp's exception with its traceback; a refusal's one line was
    printed already, and Flower still marks the run failed."""
    return not (record.exc_info and isinstance(record.exc_info[1], ExperimentRefused))


logging.getLogger("flwr").addFilter(_without_refusal_traceback)
# a client's resource error (Ray's OutOfMemoryError: kilobytes) is one line a round, by
# driftfl; Flower's copy of it, with its traceback, only with verbose=true
logging.getLogger("flwr").addFilter(quiet_flower_errors)


@app.main()
def main(grid: Grid, context: Context) -> None:
    launched = float(context.run_config.get("launched", 0.0)) or time.time()  # the start-up's start
    one_blas_thread()
    for key, variable in (("mlflow-uri", "MLFLOW_TRACKING_URI"),
                          ("mlflow-experiment", "MLFLOW_EXPERIMENT_NAME")):
        if value := str(context.run_config.get(key, "")):  # what driftfl run chose
            os.environ[variable] = value
    run_dir = context.run_config.get("run-dir") or (
        paths.home() / "runs" / time.strftime("%Y-%m-%d") / time.strftime("%H-%M-%S"))
    try:
        cfg = compose(experiment_overrides(context.run_config))
        since = (f" ({time.time() - launched:.1f} s after driftfl run began)"
                 if context.run_config.get("launched") else "")
        print(f"driftfl: the ServerApp is up{since}; loading {cfg.dataset.name}", flush=True)
        experiment = prepare_experiment(cfg)
        run_experiment(grid, experiment, Path(str(run_dir)), context.run_id,
                       resume=bool(context.run_config.get("resume", False)), launched=launched)
    except ConfigError as err:
        print(f"driftfl: error: {err}", flush=True)
        # An Exception, not SystemExit: Flower then flushes the logs and marks the run failed.
        raise ExperimentRefused(str(err)) from None


def run_experiment(grid: Grid, experiment: Experiment, run_dir: Path, run_id: int,
                   resume: bool = False, launched: float | None = None) -> dict:
    """The whole run; ``resume``: go on from the checkpoint in ``run_dir``; ``launched``: when
    its start-up began (time.time(); None: now)."""
    launched = time.time() if launched is None else launched
    cfg = experiment.cfg
    if not cfg.verbose:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    else:
        logging.getLogger("flwr").removeFilter(quiet_flower_errors)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    # too few simulated nodes, or a bad owners file, is known at once: refused before the run
    # directory is written
    federation = Federation.of(grid, cfg)
    model = experiment.initial_model()
    strategy = build_strategy(cfg, model, experiment.aux_set(model),
                              claims_counts=federation.claims_counts)
    saved = checkpoint.load(run_dir, cfg, model, strategy) if resume else None
    # what a stopped DP run released after its checkpoint: charged again on top of it (a run
    # stopped before its first checkpoint goes on from round 0, its charges kept)
    book, unfinished = (ledger.resumed(run_dir, strategy.release, saved) if resume
                        else (ledger.Ledger.fresh(run_dir), []))
    recorder = RunRecorder(run_dir, cfg, run_id, saved)
    # what every message to a client carries: the experiment and how to read its data
    experiment_record = ConfigRecord({EXPERIMENT: cfg.to_json(),
                                      DATASET_META: experiment.meta.to_json()})
    clients = federation.meet(experiment_record, experiment.partition_histograms)
    moved = checkpoint.restore(strategy, saved, clients) if saved else {}
    if unfinished:
        strategy.release.lost.extend(unfinished)
    strategy.meet(clients)
    if cfg.secagg.enabled:
        check_weights(cfg.secagg, clients, unweighted=not strategy.release.weighs_examples)

    def clients_moved(now: list[dict], moved: dict[int, int]) -> None:
        strategy.rejoin(now, moved)
        recorder.clients_moved(now, moved)

    federation.start(clients, run_dir, experiment_record, clients_moved)
    title = (f"{cfg.strategy.name} on {cfg.dataset.name}, {describe(cfg.partition)}, "
             f"{len(clients)} clients, {cfg.model.name}")
    classes = list(experiment.data.classes)
    print(console.partition_table(clients, classes, title), flush=True)
    gaps = console.coverage_gaps(clients, classes)
    if warning := console.coverage_warning(gaps, classes, cfg.partition.name):
        print(warning, flush=True)
    if trust := trust_line(cfg, strategy.aggregation, federation.claims_counts):
        print(trust, flush=True)
    if plan := strategy.release.plan(cfg.rounds):
        print(plan, flush=True)
    if swamped := strategy.release.swamped(sum(  # the float coordinates DP noises
            v.numel() for v in model.state_dict().values() if v.is_floating_point())):
        print(swamped, flush=True)
    aux_labels = experiment.data.train_y[experiment.aux_indices]
    recorder.partition({"dataset": cfg.dataset.name, "partition": cfg.partition.model_dump(),
                        "seed": cfg.seed, "classes": list(experiment.data.classes),
                        "clients": clients,
                        "aux_set": {"per_class": experiment.aux_per_class,
                                    "indices": experiment.aux_indices.tolist(),
                                    "label_histogram": np.bincount(
                                        aux_labels, minlength=experiment.data.num_classes
                                    ).tolist()}})
    federation.record_moves(recorder, clients, moved)

    evaluator = RoundEvaluator(experiment, copy.deepcopy(model), strategy, federation.grid,
                               recorder)
    arrays = model_to_arrays(model)
    if saved:
        arrays = to_record(saved["arrays"])
        checkpoint.restore_random(saved)
        federation.grid.take()  # the data survey again: round 0's row counted it once already
        print(f"driftfl: resuming {run_dir} after round {saved['round']} of {cfg.rounds}",
              flush=True)
    elif resume:
        print(f"driftfl: resuming {run_dir} from round 0: it stopped before its first "
              "checkpoint", flush=True)
    if charged := ledger.charged_line(unfinished):
        print(charged, flush=True)
    recorder.begin_rounds(time.time() - launched)  # round 1 is timed as every later round
    evaluator.round_started = time.perf_counter()
    print(f"driftfl: start-up {console.duration(recorder.startup_seconds)} "
          f"({federation.startup})", flush=True)

    latest = {"arrays": arrays}  # the model after the last round that ran

    def after_round(server_round: int, arrays: ArrayRecord) -> None:
        latest["arrays"] = arrays
        book.record(strategy.release)  # before the checkpoint: never behind it
        checkpoint.save(run_dir, server_round, to_numpy(arrays), strategy, recorder.rows,
                        recorder.arrays, recorder.total_seconds(), cfg, book.binding())
        if stop := stop_reason(recorder.rows, cfg.max_rounds_without_reply,
                               telling(strategy.report.rejected)):
            raise RunStopped(stop)

    stopped, budget = "", ""
    try:
        budget = run_rounds(strategy, federation, arrays,
                   first_round=saved["round"] + 1 if saved else 1,
                   num_rounds=cfg.rounds, timeout=cfg.round_timeout,
                   train_config=experiment_record,
                   evaluate_config=ConfigRecord(dict(experiment_record)),
                   evaluate_fn=evaluator, after_round=after_round, secagg=cfg.secagg,
                   before_train=lambda r: book.charge(strategy.release, r))
    except (ConfigError, RunStopped) as err:  # the roster: fewer than min_clients connected;
        stopped = str(err)                    # or rounds in a row without a usable reply
    book.record(strategy.release)  # a round stopped after it went out stays charged
    load_arrays(model, latest["arrays"])
    rows = recorder.rows
    best = max(rows, key=lambda r: r["test_accuracy"])
    status = run_status(rows, stopped=stopped, min_clients=cfg.min_clients,
                        connected=None if stopped else federation.connected_count(),
                        last_rejection=telling(strategy.report.rejected))
    summary = {**status, "rounds": cfg.rounds,
               "rounds_without_usable_reply": sum(not learned(r) for r in rows[1:]),
               "final_accuracy": rows[-1]["test_accuracy"], "final_loss": rows[-1]["test_loss"],
               "best_accuracy": best["test_accuracy"], "best_round": best["round"],
               **recorder.timing(), **gaps, "excluded": list(strategy.clients.excluded),
               **({"resumed_after_round": saved["round"]} if saved else {}),
               **byte_totals(rows), **privacy_summary(strategy, rows, budget)}
    note = console.protection_note(strategy.release.label, summary)
    recorder.finish(model, summary, f"{title}\n{note}" if note else title)
    if summary["status"] == "failed":
        raise ConfigError(summary["reason"])
    print(console.summary_line(summary, run_dir), flush=True)
    return summary


class RoundEvaluator:
    """Flower's ``evaluate_fn``: after every round, test the global model centrally and record
    the round's row (accuracy, loss, per-class accuracy, time, bytes, client metrics)."""

    def __init__(self, experiment: Experiment, model, strategy: DriftStrategy,
                 grid: MeteredGrid, recorder: RunRecorder):
        cfg, data = experiment.cfg, experiment.data
        self.cfg, self.strategy, self.grid, self.recorder = cfg, strategy, grid, recorder
        self.model = model.to(cfg.device)
        x, y = to_tensors(data.test_x, data.test_y, data.mean, data.std)
        self.x, self.y = x.to(cfg.device), y.to(cfg.device)
        self.num_classes = data.num_classes
        self.mean, self.std = data.mean, data.std
        self.round_started = time.perf_counter()

    def accuracy_of(self, arrays: dict[str, np.ndarray]) -> float:
        """Test accuracy of another model (a teacher, ...) on the central test set."""
        scratch = copy.deepcopy(self.model)
        load_numpy(scratch, arrays)
        return evaluate(scratch, self.x, self.y, self.cfg.eval_batch_size, self.num_classes)[1]

    def __call__(self, server_round: int, arrays) -> MetricRecord:
        eval_started = time.perf_counter()
        load_arrays(self.model, arrays)
        loss, accuracy, per_class = evaluate(
            self.model, self.x, self.y, self.cfg.eval_batch_size, self.num_classes,
            Progress(f"round {server_round}: the server's evaluation", "test images").update)
        report = self.strategy.report if server_round > 0 else None
        row = {"round": server_round, "test_accuracy": accuracy, "test_loss": loss}
        if report:  # the clients' metrics (train-loss -> train_loss, ...), then the server's
            row.update(client_columns(report, self.strategy.server_columns))
            row.update(self.strategy.server_metrics(self.accuracy_of))
            self.recorder.add_arrays(server_round, self.strategy.round_arrays())
            self.recorder.add_images(self.strategy.round_images(), self.mean, self.std)
            updates, clients = self.strategy.last_updates, self.strategy.clients
            figures = client_figures(server_round, updates, clients.name)
            row.update(spread_columns(figures))  # per-client evaluation (client_test_fraction)
            self.recorder.add_clients(server_round, client_rows(server_round, report, updates,
                                                                  clients))
        now = time.perf_counter()  # diagnostics above count as evaluation, not training
        traffic = self.grid.take()  # in all and by payload kind (round 0: the data survey)
        row.update({"seconds": now - self.round_started,
                    "train_seconds": eval_started - self.round_started if server_round else 0.0,
                    "eval_seconds": now - eval_started,
                    "clients": report.clients if report else 0,
                    "model_updated": int(bool(report and report.model_updated)),
                    "rejected": len(report.rejected) if report else 0,
                    "rejected_partitions": " ".join(report.rejected_partitions) if report else "",
                    # of those, the replies that failed for want of a resource (Ray's memory
                    # monitor killed the worker, ...): the client was not at fault
                    "failed_partitions": " ".join(p for p, _ in report.failed) if report else "",
                    "failed_for": "; ".join(sorted({r for _, r in report.failed}))
                    if report else "",
                    "lost_partitions": " ".join(report.lost) if report else "",
                    "late_partitions": " ".join(report.late) if report else "",
                    **({"dropped_partitions": " ".join(report.dropped) if report else ""}
                       if self.strategy.plan.heterogeneity.enabled else {}),
                    "refused_state": "; ".join(report.refused_state) if report else "",
                    # SecAgg+: why a round released nothing, or how its update was held
                    **({"secagg_outcome": (report.held if report.model_updated
                                           else report.refused_aggregate) if report else ""}
                       if self.strategy.release.secure else {}),
                    **traffic, "per_class_accuracy": per_class})
        # the server's own numbers last: nothing above may stand in for them
        row.update({"round": server_round, "test_accuracy": accuracy, "test_loss": loss})
        # differential privacy: what the round released with, and epsilon so far
        row.update(self.strategy.release.columns(server_round))
        self.recorder.add_round(row)
        release = self.strategy.release
        print(console.round_line(row, self.cfg.rounds, secure=release.secure,
                                 dp="" if release.name == "plain" else release.name,
                                 left=console.time_left(self.recorder.rows, self.cfg.rounds)),
              flush=True)
        self.round_started = now
        return MetricRecord({"accuracy": accuracy, "loss": loss})


def privacy_summary(strategy: DriftStrategy, rows: list[dict], budget: str) -> dict:
    """The privacy spent (epsilon at delta after the last round run), and why the run stopped
    before its last round if the budget stopped it; nothing without differential privacy."""
    spent = strategy.release.summary()
    if not spent:
        return {}
    return {**spent, "rounds_run": rows[-1]["round"], **({"budget_stop": budget} if budget else {})}


def byte_totals(rows: list[dict]) -> dict[str, int]:
    """The run's bytes in all and by payload kind: each bytes_* column summed over the rounds."""
    names = dict.fromkeys(k for r in rows for k in r if k.startswith("bytes_"))
    return {name: sum(r.get(name, 0) for r in rows) for name in names}


def client_columns(report, server_columns: frozenset[str]) -> dict:
    """The clients' averaged metrics as row columns; the checks refused any that would name
    one of the server's (``columns.forged_column``), and the strategy's own measurements
    (``server_columns``) take the place of a client metric of the same name."""
    row = {}
    for key, value in {**report.train_metrics, **report.evaluate_metrics}.items():
        name = column(key)
        if key in (ACC_BEFORE, ACC_AFTER):  # per client, in clients.csv and the spread columns
            continue
        if not forged_column(key) and name not in server_columns:
            row[name] = value
    return row
