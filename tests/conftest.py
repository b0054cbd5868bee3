"""Shared test set-up: caches and outputs go to a per-session temporary directory."""

from __future__ import annotations

import contextlib
import json
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


@contextlib.contextmanager
def host_with(tmp_path_factory, name: str, **extra: str):
    """A simulation host (Ray and a SuperLink, driftfl.host) whose processes, Ray's workers
    included, run with ``extra`` in their environment; yields the environment a `driftfl run`
    gets to submit to it (DRIFTFL_HOST), and stops it after. Its Ray counts one CPU, so a run's
    clients take turns in one worker: the suite runs a worker per core, each with hosts of its
    own, and a second Ray worker per run (its own imports, about 5.5 s of CPU) would only
    compete for the same core. Runs that are about clients training side by side start their
    own host (the stop and sweep tests)."""
    from driftfl.host import HOST_ENV, SimulationHost

    host = SimulationHost(None, tmp_path_factory.mktemp(name) / "host.log")
    try:
        with pytest.MonkeyPatch.context() as patch:  # the host's processes only
            for key, value in {"RAY_OVERRIDE_RESOURCES": json.dumps({"CPU": 1}),
                               **extra}.items():
                patch.setenv(key, value)
            host.start()
        yield {**os.environ, HOST_ENV: host.flwr_home}
    finally:
        host.close(quick=True)


@pytest.fixture(scope="session")
def simulation_host(tmp_path_factory):
    """One simulation host for the session's `driftfl run`s that are not about starting or
    stopping one (host_with). Started on first use, stopped when the session ends."""
    with host_with(tmp_path_factory, "simulation-host") as env:
        yield env


# seconds each of the longest modules took with two workers on 2 cores (benchmarks/
# suite_time.py, docs/benchmarks.md; the compose demo's as in CI, which builds its image and
# base image from nothing): they start first, so that none is left running alone at the end
# of the suite while the other workers idle
LONGEST = {"tests/e2e/test_e2e_deployment_two_nodes.py": 490, "tests/e2e/test_e2e_compose.py": 450,
           "tests/e2e/test_e2e_readme.py": 420, "tests/e2e/test_e2e_deployment.py": 305,
           "tests/e2e/test_e2e_every_method.py": 280, "tests/e2e/test_e2e_simulation.py": 190,
           "tests/e2e/test_e2e_readme_deployment.py": 100, "tests/tools/test_gpu_sim.py": 60}


def pytest_collection_modifyitems(config, items):
    """Modules that start real processes run first (e2e, then slow), the longest of them first:
    with the suite spread over workers a module at a time (pyproject's --dist loadfile), the
    many short modules then fill in around them. Within a tier, the order of collection."""
    def tier(item) -> int:
        markers = {m.name for m in item.iter_markers()}
        return 0 if "e2e" in markers else 1 if "slow" in markers else 2

    first: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        first[module] = min(first.get(module, 2), tier(item))
    items.sort(key=lambda item: (first[module := item.nodeid.split("::", 1)[0]],
                                 -LONGEST.get(module, 0)))


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: a worker per core, at least two and at most six. An e2e test waits on the
    processes it started (a SuperNode polls every 3 s), time another worker's test can use; but
    each test starts several processes (a run's ServerApp and Ray actors), and Flower's and
    Ray's processes poll while they wait, so a crowded machine spends more CPU on the same
    suite: on 2 cores, 3 workers took 44 min where 2 took 30 (benchmarks/suite_time.py)."""
    return min(6, max(2, os.cpu_count() or 1))
