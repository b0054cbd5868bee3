"""docs/deployment.md followed as a new user would (readme_walk.py): the secure path and "On
one machine", from a fresh HOME. Both listen on the page's own ports (9090, 9091, 9101, ...),
so they run one after the other in this module."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from conftest import REPO
from readme_walk import Walk, paragraph_blocks, sections

pytestmark = pytest.mark.e2e
DEPLOYMENT = (REPO / "docs" / "deployment.md").read_text()
DEPLOYMENT_TITLE = DEPLOYMENT.splitlines()[0].lstrip("# ")


@pytest.fixture
def walk(tmp_path):
    walk = Walk(REPO, tmp_path)
    try:
        yield walk
    finally:
        walk.close()


def completed(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed", summary
    return summary


def test_the_secure_deployment_runs_as_written(walk, fmnist_available, nginx_installed):
    blocks = sections(DEPLOYMENT)[DEPLOYMENT_TITLE]
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
    block = paragraph_blocks(DEPLOYMENT, f"# {DEPLOYMENT_TITLE}", "**On one machine**")[0]
    out = walk.block(block)[-1]
    assert "round   1/1" in out.stdout, out.stdout[-3000:]
    assert "Traceback" not in out.stdout + out.stderr
