"""What the benchmarks share: run driftfl for real and read back its per-round metrics; or
answer its messages in this process and read a profile of them."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def driftfl_rounds(overrides: list[str]) -> list[dict]:
    """The trained rounds (1..R) of a `driftfl run` with these overrides."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        script = Path(sys.executable).parent / "driftfl"  # else not installed (a GPU machine)
        driftfl = [str(script)] if script.exists() else [sys.executable, "-m", "driftfl.cli"]
        out = subprocess.run([*driftfl, "run", *overrides, f"hydra.run.dir={run_dir}"],
                             cwd=tmp, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"driftfl run failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        rows = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    return [r for r in rows if r["round"] > 0]


def steady(rows: list[dict], key: str) -> float:
    """Median over rounds 2..R: round 1 holds Ray's start and the first data load."""
    return statistics.median(r[key] for r in rows[1:])


def in_process_federation(overrides: list[str]):
    """The experiment's strategy and a grid whose Fashion-MNIST nodes are ClientApp calls in
    this process (no Flower transport, no Ray), the clients already met: (cfg, initial model,
    strategy, grid, the config record every message carries)."""
    sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "strategies")]
    from flwr.app import ConfigRecord
    from flwr.supercore.task_identity import TaskIdentity
    from test_methods import InProcessGrid, fmnist_nodes

    from driftfl.common.config import compose
    from driftfl.common.protocol import DATASET_META, EXPERIMENT
    from driftfl.methods import build_strategy
    from driftfl.server.experiment import prepare_experiment
    from driftfl.server.survey import survey_clients

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):
        setattr(TaskIdentity, name, value)  # Flower stamps messages with a task identity
    experiment = prepare_experiment(compose([*overrides, "verbose=false"]), make_partition=True)
    cfg, model = experiment.cfg, experiment.initial_model()
    strategy = build_strategy(cfg, model, experiment.aux_set(model))
    grid = InProcessGrid(fmnist_nodes(cfg.num_clients))
    record = ConfigRecord({EXPERIMENT: cfg.to_json(), DATASET_META: experiment.meta.to_json()})
    strategy.meet(survey_clients(grid, record, cfg.num_clients, node_wait=5, timeout=60))
    return cfg, model, strategy, grid, record


def cumulative_seconds(stats: dict, filename: str, function: str) -> float:
    """A cProfile's (pstats.Stats(...).stats) cumulative seconds in ``function`` of a file
    named ``filename``."""
    return sum(cumulative for (path, _, fn), (_, _, _, cumulative, _) in stats.items()
               if fn == function and path.endswith(filename))
