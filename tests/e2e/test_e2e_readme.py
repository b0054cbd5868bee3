"""README.md and the pages it sends a new user to, followed as that user would: the README's
first experiment, every command block of docs/running.md's opening, sweeps and reports, and
stopping and resuming, and docs/deployment.md's (the secure path and "On one machine"), read
from the pages themselves and run in order from a fresh HOME (see readme_walk.py for the only
changes made: fewer rounds, a data subset, 127.0.0.1 for the example hosts)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO
from driftfl.host import HOST_ENV
from driftfl.server.checkpoint import saved_round
from readme_walk import Walk, commands, sections, smaller

pytestmark = pytest.mark.e2e
README = (REPO / "README.md").read_text()
RUNNING = (REPO / "docs" / "running.md").read_text()


@pytest.fixture
def walk(tmp_path, simulation_host):
    """The walk's runs submit to the session's simulation host: a run starting its own is what
    test_e2e_sweep.py, test_e2e_orphans.py and the stop tests prove."""
    walk = Walk(REPO, tmp_path, host=simulation_host[HOST_ENV])
    try:
        yield walk
    finally:
        walk.close()


def jobs(sweep: str) -> int:
    """How many jobs a sweep command makes: the product of its comma lists."""
    return math.prod(len(word.split("=", 1)[1].split(",")) for word in sweep.split()
                     if "=" in word and "," in word)


def completed(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed", summary
    return summary


def test_the_running_and_report_blocks_run_as_written(walk, fmnist_available):
    first = sections(README)["A first experiment"]
    for block in first:  # the README's run, sweep and report
        walk.block(block)
    [sweep] = [c for b in first for c in commands(b) if " -m " in c]
    sweeps = sorted(p.parent for p in (walk.cwd / "sweeps" / "first").rglob("summary.json"))
    assert len(sweeps) == jobs(sweep) and all(completed(run) for run in sweeps)
    assert (walk.cwd / "sweeps" / "first" / "report.md").is_file()
    found = sections(RUNNING)
    for block in found["Running experiments"]:
        walk.block(block)
    runs = sorted(p.parent for p in (walk.cwd / "outputs").rglob("summary.json"))
    assert len(runs) == 2 and all(completed(run) for run in runs)  # README's and this page's
    [sweep] = [c for b in found["Running experiments"] for c in commands(b) if " -m " in c]
    sweeps = sorted(p.parent for p in (walk.cwd / "multirun").rglob("summary.json"))
    assert len(sweeps) == jobs(sweep) and all(completed(run) for run in sweeps)
    for block in found["Many runs: sweeps and reports"]:
        walk.block(block)
    for name in ("report.md", "report.csv", "report.png"):
        assert (walk.cwd / "sweeps" / "dir01" / name).is_file(), name


def test_a_stopped_run_resumes_as_the_readme_says(walk, fmnist_available):
    """The user's run was stopped with Ctrl-C after a round, which said how to go on in one
    line (kept in the run directory: through a pipe there is no reader left); the README's
    command goes on and ends with the same bytes and rows as the run never
    stopped (clients finish in any order; the server averages in node order). Another setting
    is refused before anything is written. The stopped run starts a host of its own (stopping
    it is what the test is about); the others submit to the session's."""
    [block] = sections(RUNNING)["Stopping and resuming a run"]
    [command] = commands(block)
    walk.rounds = 3
    resumed = re.search(r"resume=(\S+)", command).group(1)
    started = smaller(command.replace(f"resume={resumed}", f"hydra.run.dir={resumed}"), 3)
    walk.run(started.replace(f"hydra.run.dir={resumed}", "hydra.run.dir=whole"))
    # the user ran it through a pipe (`... 2>&1 | tee run.log`), which Ctrl-C stops too: the
    # shell keeps the run's exit code; its stop line has no reader and no terminal here, and
    # the run directory keeps it
    log, code = walk.root / "run.log", walk.root / "exit-code"
    piped = f"trap true INT; {started} 2>&1 | tee {log}; echo ${{PIPESTATUS[0]}} > {code}"
    # Ctrl-C as a terminal delivers it, even when the suite itself was started in the
    # background (where a shell ignores SIGINT, and every child inherits that)
    alone = {k: v for k, v in walk.env.items() if k != HOST_ENV}
    run = subprocess.Popen(["bash", "-c", piped], cwd=walk.cwd, env=alone,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 600
    while not (walk.cwd / resumed / "checkpoint.pt").exists():
        assert run.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    os.killpg(run.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
    assert run.wait(timeout=120) == 0 and code.read_text() == "130\n", log.read_text()[-3000:]
    said = (walk.cwd / resumed / "stopped.txt").read_text()
    done, _ = saved_round(walk.cwd / resumed)  # the checkpoint's: the round it says is saved
    assert said.splitlines() == [  # the run's own overrides are kept in its directory
        f"driftfl: stopped; it is saved after round {done} of 3, go on with: driftfl run "
        f"resume={walk.cwd / resumed}"], said
    assert "Traceback" not in log.read_text()

    [out] = walk.block(block)
    assert f"driftfl: resuming {walk.cwd / resumed} after round" in out.stdout
    assert completed(walk.cwd / resumed)["rounds"] == 3
    whole, stopped = walk.cwd / "whole", walk.cwd / resumed
    assert (whole / "model.pt").read_bytes() == (stopped / "model.pt").read_bytes()
    timing = ("seconds", "train_seconds", "eval_seconds")
    assert ([{k: v for k, v in r.items() if k not in timing} for r in rounds_of(whole)]
            == [{k: v for k, v in r.items() if k not in timing} for r in rounds_of(stopped)])

    refused = subprocess.run(["bash", "-c", smaller(f"{command} lr=0.01", 3)], cwd=walk.cwd,
                             env=walk.env, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "lr (0.05 there, 0.01 here); a resumed run keeps the " \
        "settings it ran with (its config.yaml) but for rounds and " in refused.stderr


def rounds_of(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "metrics.json").read_text())["rounds"]
