"""`driftfl run` killed with SIGKILL leaves nothing behind: its watchdog ends the private
SuperLink, flwr-simulation and Ray's processes (the probe found them all still running ten
minutes after such a kill)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from conftest import driftfl_bin

pytestmark = pytest.mark.e2e
CLEANUP_LIMIT = 30.0  # seconds from the kill until no process of the run is left
RUN = ["model=mlp", "dataset.subset=4000", "dataset.test_subset=2000", "num_clients=4",
       "rounds=200", "lr=0.05"]


def flwr_home_of(proc: psutil.Process) -> str | None:
    try:
        return proc.environ().get("FLWR_HOME")
    except psutil.Error:
        return None


def session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def left(tree: list[psutil.Process], flwr_home: str, sessions: set[int]) -> list[str]:
    """What of the run still runs: recorded descendants (psutil checks a pid was not reused),
    any process in a session they started, any process started with the run's FLWR_HOME."""
    alive = {p.pid: p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE}
    alive.update({p.pid: p for p in psutil.process_iter()
                  if session_of(p.pid) in sessions or flwr_home_of(p) == flwr_home})
    names = []
    for pid, proc in alive.items():
        try:
            names.append(f"{pid} {proc.name()}")
        except psutil.Error:
            pass
    return names


def test_a_run_killed_with_sigkill_leaves_no_process_behind(tmp_path, fmnist_available):
    run = subprocess.Popen([driftfl_bin(), "run", *RUN, f"hydra.run.dir={tmp_path / 'run'}"],
                           cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        seen = []
        for line in run.stdout:  # training started: the first round's line
            seen.append(line)
            if line.startswith("round   1/"):
                break
        assert seen and seen[-1].startswith("round   1/"), "".join(seen)
        tree = psutil.Process(run.pid).children(recursive=True)
        commands = {p.pid: " ".join(p.cmdline()) for p in tree}
        for started in ("flower-superlink", "flwr-simulation", "raylet", "gcs_server"):
            assert any(started in c for c in commands.values()), commands
        flwr_home = next(h for p in tree if "flower-superlink" in commands[p.pid]
                         and (h := flwr_home_of(p)))
        app = next(words[words.index("run") + 1] for c in commands.values()
                   if "run" in (words := c.split())
                   and any(w.endswith("flwr") for w in words[:words.index("run")]))
        assert app.startswith(flwr_home), app  # the app's scratch copy goes with FLWR_HOME
        sessions = {session_of(p.pid) for p in tree} - {os.getsid(0), None}
        killed = time.monotonic()
        run.kill()
        run.wait()
        while (remaining := left(tree, flwr_home, sessions)) and \
                time.monotonic() - killed < CLEANUP_LIMIT:
            time.sleep(0.2)
        took = time.monotonic() - killed
        assert remaining == [], f"still running {took:.0f} s after the kill: {remaining}"
        # the watchdog removed the scratch FLWR_HOME, and with it the app's copy
        assert not Path(flwr_home).exists()
        print(f"the run's {len(tree)} processes were gone {took:.1f} s after the SIGKILL")
    finally:
        if run.poll() is None:
            run.kill()
        run.stdout.close()
