"""What `driftfl run` says of a stopped or failed run is what its run directory holds: the
results of a server that had finished, the round its checkpoint saved and how to go on, or
nothing; and RAY_TMPDIR keeps each run's private Ray apart from every other on the machine."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest

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


class FinishingHost:
    """A host whose run finishes its last round while it is being stopped: the checkpoint says
    round 2 of 3 when the stop lands, summary.json is there once ``close`` returns."""

    env, flwr_home, log, attached = {}, None, "superlink.log", False

    def __init__(self, run_dir):
        self.run_dir, self.closed = run_dir, 0

    def start(self, resume):
        checkpoint_after(self.run_dir, 2)

    @contextlib.contextmanager
    def turn(self):
        yield

    def close(self, quick=False):
        if not self.closed:
            checkpoint_after(self.run_dir, 3)
            (self.run_dir / "summary.json").write_text(json.dumps({"status": "completed"}))
        self.closed += 1


def test_a_stop_while_the_last_round_finishes_names_the_completed_run(monkeypatch, tmp_path,
                                                                      capsys):
    """The stop's line is formed after the run's process ended (issue 52: it said "saved after
    round 2 of 3, go on with resume" of a completed run, whose resume is then refused)."""
    import driftfl.host
    import driftfl.launch as launch
    from driftfl.common.config import compose

    host = FinishingHost(tmp_path)
    monkeypatch.setattr(driftfl.host, "host_for", lambda *_: (host, False))
    monkeypatch.setattr(launch, "check_launch", lambda *_: None)
    monkeypatch.setattr(launch.signal, "signal", lambda *_: None)

    def interrupted(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr(launch, "follow", interrupted)
    with pytest.raises(SystemExit):
        launch.launch_simulation(compose(OVERRIDES[:2]), OVERRIDES, tmp_path)
    err = capsys.readouterr().err
    assert f"driftfl: stopped; the run had finished (completed); its results are in {tmp_path}" \
        in err and "go on with" not in err
    assert host.closed >= 1


def test_an_unreadable_summary_is_named_not_a_traceback(tmp_path):
    (tmp_path / "summary.json").write_text('{"status": "compl')
    assert saved(tmp_path, OVERRIDES) == \
        f"its summary.json cannot be read; what the run wrote is in {tmp_path}"
