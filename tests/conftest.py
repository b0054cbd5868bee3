"""Shared test set-up: caches and outputs go to a per-session temporary directory."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("driftfl-home")
    old = {k: os.environ.get(k) for k in ("DRIFTFL_CACHE", "DRIFTFL_HOME")}
    os.environ["DRIFTFL_CACHE"] = str(root / "cache")
    os.environ["DRIFTFL_HOME"] = str(root / "home")
    yield root
    for key, value in old.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def fmnist_available():
    if not (FMNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.fail("Fashion-MNIST is missing: sudo apt-get install -y dataset-fashion-mnist "
                    "(scripts/setup.sh installs it)")
    return FMNIST_DIR


def driftfl_bin() -> str:
    """The driftfl console script of the environment running the tests."""
    import sys

    beside = Path(sys.executable).parent / "driftfl"
    return str(beside) if beside.exists() else shutil.which("driftfl")


@pytest.fixture
def server_task(monkeypatch):
    """Flower stamps new messages with the running task's identity; give tests one."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value)

@pytest.fixture(scope="module")
def nginx_installed():
    """The fleet proxy's nginx, installed by the deployment set-up script when missing."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "setup-deployment.sh")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture(scope="module")
def one_thread():
    """Tensors this small gain nothing from threads, which slow badly when the CPU is busy."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
