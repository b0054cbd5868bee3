"""What `driftfl run` says of a stopped or failed run is what its run directory holds: the
results of a server that had finished, the round its checkpoint saved and how to go on, or
nothing; and RAY_TMPDIR keeps each run's private Ray apart from every other on the machine."""

from __future__ import annotations

import json

import numpy as np

from driftfl.host import flwr_env
from driftfl.launch import not_completed, saved
from driftfl.server import treefile
from driftfl.server.checkpoint import CHECKPOINT

OVERRIDES = ["strategy=fedprox", "rounds=3", "hydra.run.dir=ignored"]


def checkpoint_after(run_dir, done: int, rounds: int = 3) -> None:
    """The part of a checkpoint the message reads (a real one holds the model and more)."""
    treefile.write(run_dir / CHECKPOINT, {"round": done, "config": {"rounds": rounds},
                                          "arrays": {"w": np.zeros(2, np.float32)}})


def test_a_run_stopped_before_its_first_round_ended_saved_nothing(tmp_path):
    assert saved(tmp_path, OVERRIDES) == \
        "nothing was saved: it stopped before its first round ended"


def test_a_run_stopped_after_a_round_names_that_round_and_how_to_go_on(tmp_path):
    checkpoint_after(tmp_path, 1)
    assert saved(tmp_path, OVERRIDES) == (
        f"it is saved after round 1 of 3, go on with: driftfl run strategy=fedprox rounds=3 "
        f"resume={tmp_path}")
    checkpoint_after(tmp_path, 3)
    assert saved(tmp_path, OVERRIDES) == \
        f"all 3 rounds are saved in {tmp_path / CHECKPOINT}, but not its results"
    (tmp_path / CHECKPOINT).write_bytes(b"PK\x03\x04 truncated")
    assert saved(tmp_path, OVERRIDES) == \
        f"its {CHECKPOINT} cannot be read, so it cannot be resumed"


def test_a_run_whose_server_had_finished_says_so_and_offers_no_resume(tmp_path):
    checkpoint_after(tmp_path, 3)
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed"}))
    assert saved(tmp_path, OVERRIDES) == \
        f"the run had finished (completed); its results are in {tmp_path}"


def test_a_run_that_did_not_complete_says_what_is_saved(tmp_path):
    checkpoint_after(tmp_path, 2)
    assert not_completed(tmp_path, OVERRIDES, "see the log above").splitlines() == [
        f"driftfl: the run did not complete (no summary.json in {tmp_path}); see the log above.",
        f"driftfl: it is saved after round 2 of 3, go on with: driftfl run strategy=fedprox "
        f"rounds=3 resume={tmp_path}"]
    (tmp_path / "summary.json").write_text(json.dumps({"status": "failed", "reason": "x"}))
    assert not_completed(tmp_path, OVERRIDES, "see the log above") == \
        f"driftfl: the run failed; its summary.json and rounds are in {tmp_path}"


def test_a_private_ray_keeps_its_files_in_the_runs_scratch_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # left in the user's shell
    monkeypatch.setenv("RAY_TMPDIR", "/tmp")
    env = flwr_env(str(tmp_path))
    assert "RAY_ADDRESS" not in env and env["RAY_TMPDIR"] == str(tmp_path)
    # a shared cluster (simulation.ray_address) is joined as named; its files are its own
    env = flwr_env(str(tmp_path), "127.0.0.1:6379")
    assert env["RAY_ADDRESS"] == "127.0.0.1:6379" and env["RAY_TMPDIR"] == "/tmp"
