"""README.md as a new user follows it: every command block of Running experiments (with its
sweeps and reports), Stopping and resuming a run, and Deployment (the secure path and "On one
machine"), read from the README itself and run in order from a fresh HOME (see readme_walk.py
for the only changes made: fewer rounds, a data subset, 127.0.0.1 for the example hosts)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO
from readme_walk import Walk, commands, paragraph_blocks, sections, smaller

pytestmark = pytest.mark.e2e
README = (REPO / "README.md").read_text()


@pytest.fixture
def walk(tmp_path):
    walk = Walk(REPO, tmp_path)
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
    found = sections(README)
    for block in found["Running experiments"]:
        walk.block(block)
    runs = sorted(p.parent for p in (walk.cwd / "outputs").rglob("summary.json"))
    sweeps = sorted(p.parent for p in (walk.cwd / "multirun").rglob("summary.json"))
    assert len(runs) == 1 and completed(runs[0])
    [sweep] = [c for b in found["Running experiments"] for c in commands(b) if " -m " in c]
    assert len(sweeps) == jobs(sweep) and all(completed(run) for run in sweeps)
    for block in found["Many runs: sweeps and reports"]:
        walk.block(block)
    for name in ("report.md", "report.csv", "report.png"):
        assert (walk.cwd / "results" / "dir01" / name).is_file(), name


def test_a_stopped_run_resumes_as_the_readme_says(walk, fmnist_available):
    """The user's run was stopped with Ctrl-C after a round; the README's command goes on."""
    [block] = sections(README)["Stopping and resuming a run"]
    [command] = commands(block)
    walk.rounds = 3
    resumed = re.search(r"resume=(\S+)", command).group(1)
    started = smaller(command.replace(f"resume={resumed}", f"hydra.run.dir={resumed}"), 3)
    with open(walk.root / "stopped.err", "w") as err:
        run = subprocess.Popen(["bash", "-c", f"exec {started}"], cwd=walk.cwd, env=walk.env,
                               stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        deadline = time.monotonic() + 600
        while not (walk.cwd / resumed / "checkpoint.pt").exists():
            assert run.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        os.killpg(run.pid, signal.SIGINT)
        assert run.wait(timeout=120) == 130
    walk.block(block)
    summary = completed(walk.cwd / resumed)
    assert summary["rounds"] == 3


def test_the_secure_deployment_runs_as_written(walk, fmnist_available, nginx_installed):
    blocks = sections(README)["Deployment"]
    operator, owner, train = blocks[0], blocks[1], blocks[2]
    walk.block(operator)
    for i in range(2):  # owner i, given ca.crt and node-<i>.key, runs the owner's command
        machine = walk.root / f"owner-{i}"
        machine.mkdir()
        for name in ("ca.crt", f"node-{i}.key"):
            shutil.copy(walk.cwd / "secure" / name, machine / name)
        walk.block(owner.replace("node-0.key", f"node-{i}.key")
                   .replace("partition-id=0", f"partition-id={i}")
                   .replace("--port 9101", f"--port {9101 + i}"), cwd=machine)
    [out] = walk.block(train)
    run_dir = walk.cwd / re.search(r"hydra\.run\.dir=(\S+)", train).group(1)
    assert completed(run_dir)["rounds"] == 1
    # should it stop, the advice fits the command that started it
    assert f"go on with resume={run_dir} (driftfl run superlink=...)" in out.stdout


def test_the_deployment_on_one_machine_runs_as_written(walk, fmnist_available):
    block = paragraph_blocks(README, "## Deployment", "**On one machine**")[0]
    out = walk.block(block)[-1]
    assert "round   1/1" in out.stdout, out.stdout[-3000:]
    assert "Traceback" not in out.stdout + out.stderr
