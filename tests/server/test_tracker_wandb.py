"""tracker=wandb: Weights & Biases offline, with no account or server: W&B's own offline run
under the run directory, holding the run's config, every round's numeric columns and the
summary; a resumed run goes on in the same W&B run; wandb missing is refused in one line.
(wandb writes an offline run as its binary record log, which only `wandb sync` reads back; the
test looks for what was logged in its bytes.)"""

from __future__ import annotations

import json
import math
import re
import time

import pytest
import torch

from driftfl.common.config import compose
from driftfl.common.errors import ConfigError
from driftfl.server import tracker_wandb
from driftfl.server.results import RunRecorder

BASE = {"test_loss": 1.0, "seconds": 1.0, "train_seconds": 0.5, "eval_seconds": 0.5,
        "clients": 2, "rejected": 0, "bytes_sent": 10, "bytes_received": 10}


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No W&B account or setting of the user's: offline, as a new user runs it."""
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")


def record(run_dir, rounds, resumed=None):
    recorder = RunRecorder(run_dir, compose(["tracker=wandb", "strategy=fedprox",
                                             f"rounds={rounds}"]), run_id=1, resumed=resumed)
    first = resumed["round"] + 1 if resumed else 0
    for r in range(first, rounds + 1):
        recorder.add_round({"round": r, "test_accuracy": (0.1, 0.4, 0.6)[r], **BASE,
                            "per_class_accuracy": [0.5, math.nan]})
    return recorder


def offline_runs(run_dir, holding: bytes = b"", timeout: float = 30) -> dict[str, bytes]:
    """Each offline run folder W&B wrote under the run directory: its record log's bytes, once
    every log holds ``holding``. W&B's writer is a process of its own, which may still be
    writing the log when ``finish()`` has returned (seen once in about 30 runs on a busy
    machine: the log's header alone)."""
    deadline = time.monotonic() + timeout
    while True:
        runs = {folder.name: b"".join(log.read_bytes() for log in folder.glob("run-*.wandb"))
                for folder in sorted((run_dir / "wandb").glob("offline-run-*"))}
        if (runs and all(holding in log for log in runs.values())) \
                or time.monotonic() > deadline:
            return runs
        time.sleep(0.2)


def test_a_run_is_written_offline_with_its_config_rounds_and_summary(tmp_path, capsys):
    run_dir = tmp_path / "run"
    recorder = record(run_dir, rounds=2)
    recorder.finish(torch.nn.Linear(2, 2), {"status": "completed", "final_accuracy": 0.6},
                    "title")
    written = json.loads((run_dir / "wandb.json").read_text())
    assert written["mode"] == "offline"
    assert f"driftfl: W&B run {written['id']} (offline) at {run_dir / 'wandb'}" in \
        capsys.readouterr().out
    [(folder, log)] = offline_runs(run_dir, holding=b"summary.final_accuracy").items()
    assert folder.endswith(f"-{written['id']}")
    for logged in (b"test_accuracy", b"acc_class_0", b"summary.final_accuracy",
                   b"strategy.name", b"fedprox"):
        assert logged in log, logged


def test_a_resumed_run_goes_on_in_the_wandb_run_it_started(tmp_path):
    run_dir = tmp_path / "run"
    first = record(run_dir, rounds=1)
    run_id = first.tracker.run.id
    first.tracker.run.finish(exit_code=1)  # the first part stopped
    again = record(run_dir, rounds=2, resumed={"rows": list(first.rows), "recorded": {},
                                               "seconds": 1.0, "round": 1})
    again.finish(torch.nn.Linear(2, 2), {"status": "completed"}, "title")
    folders = offline_runs(run_dir)
    # offline-run-<time>-<id>, and "-1" after a second part started in the same second
    assert len(folders) == 2 and all(re.fullmatch(rf"offline-run-\d+_\d+-{run_id}(-\d+)?", name)
                                     for name in folders), (run_id, list(folders))
    assert json.loads((run_dir / "wandb.json").read_text())["id"] == run_id


def test_without_wandb_the_tracker_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(tracker_wandb.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"^tracker=wandb needs the wandb package, which is "
                                          r"not installed: .*pip install wandb"):
        tracker_wandb.check_wandb()
