"""The docker-compose demo, for real: its image built from docker/Dockerfile, brought up with
podman and podman-compose (no Docker engine runs here; the set-up script installs them and
makes the base image offline), TLS and node authentication on, two rounds trained across the
containers, each node holding only its own data, a stranger on the nodes' network unable to
register, and everything brought down."""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO

pytestmark = pytest.mark.e2e

COMPOSE = REPO / "docker" / "compose.yml"
IMAGE = "localhost/driftfl-demo:latest"
BASE_IMAGE = "localhost/debian:bookworm"  # scripts/setup-deployment.sh makes it offline
TORCH = "torch==2.14.1 torchvision==0.29.1"  # as scripts/setup.sh pins it


@pytest.fixture(scope="module")
def podman_env():
    env = {**os.environ, "CONTAINERS_CONF": os.environ.get(
        "CONTAINERS_CONF", str(Path.home() / ".cache" / "driftfl" / "containers.conf"))}
    out = subprocess.run(["bash", str(REPO / "scripts" / "setup-deployment.sh"),
                          "--containers"], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    return env


def test_the_compose_file_is_valid(podman_env):
    out = subprocess.run(["docker-compose", "-f", str(COMPOSE), "config", "-q"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def _pip_settings(folder: Path) -> list[str]:
    """`podman build` volumes that give pip inside the build this machine's package sources:
    its index settings in a pip.conf, the local folders they name, the CA bundle it trusts
    (these machines reach PyPI only through them)."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True).stdout
    settings = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        settings[key.split(".")[-1]] = value.strip().strip("'")
    conf = configparser.ConfigParser()
    conf["global"] = {k: v for k, v in settings.items()
                      if k in ("index-url", "extra-index-url", "find-links")}
    volumes = []
    for value in conf["global"].values():
        for word in value.split():
            path = Path(word.removeprefix("file://"))
            if word.startswith(("file://", "/")) and path.exists():
                root = path if path.is_dir() else path.parent
                # a simple index links to files beside it: the folder that holds "simple"
                root = root.parent if root.name == "simple" else root
                volumes += ["-v", f"{root}:{root}:ro"]
    if settings.get("cert"):
        conf["global"]["cert"] = "/run/host-ca.crt"
        volumes += ["-v", f"{settings['cert']}:/run/host-ca.crt:ro"]
    with open(folder / "pip.conf", "w") as f:
        conf.write(f)
    return [*volumes, "-v", f"{folder / 'pip.conf'}:/etc/pip.conf:ro"]


def _compose(env, project: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["podman-compose", "-p", project, "-f", str(COMPOSE), *args],
                          env=env, capture_output=True, text=True, timeout=timeout)


def _podman(env, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _containers(env, project: str) -> list[str]:
    """`<name> <status>` of each of the project's containers, running or not."""
    listed = _podman(env, "ps", "-a", "--filter", f"label=io.podman.compose.project={project}",
                     "--format", "{{.Names}} {{.Status}}").stdout
    return listed.strip().splitlines()


def _wait_for_log(env, container: str, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in (log := _podman(env, "logs", container).stdout
                       + _podman(env, "logs", container).stderr):
        assert time.monotonic() < deadline, f"{container}: no '{text}' in\n{log[-3000:]}"
        time.sleep(2)


def test_the_demo_trains_across_containers_with_tls_and_authentication(podman_env, tmp_path,
                                                                     fmnist_available):
    env = {**podman_env, "DEMO_RUNS": str(tmp_path / "runs"),
           "DEMO_SPLIT": "partition.alpha=0.5 seed=0 dataset.subset=6000"}
    build = subprocess.run(
        ["podman", "build", "--network", "host", "-f", "docker/Dockerfile", "-t", IMAGE,
         "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "--build-arg", "TORCH_INDEX=",
         "--build-arg", f"TORCH={TORCH}", *_pip_settings(tmp_path), "."],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    project = f"driftfl-test-{uuid.uuid4().hex[:6]}"
    try:
        up = _compose(env, project, "up", "-d")
        # podman-compose exits 0 even when a container could not start: ask podman
        states = _containers(env, project)
        failed = [s for s in states if not s.split(" ", 1)[-1].startswith(("Up", "Exited (0)"))]
        assert up.returncode == 0 and len(states) == 7 and not failed, (
            f"not started: {failed}\n" + up.stdout[-3000:] + up.stderr[-3000:])
        _wait_for_log(env, f"{project}_operator_1", "nodes registered", 300)
        for i in range(3):
            _wait_for_log(env, f"{project}_supernode-{i}_1", "SuperNode ID", 300)

        # a stranger on the nodes' network, holding the CA certificate: registration is
        # refused at the proxy, and the SuperLink itself is out of its reach
        stranger = _podman(env, "run", "--rm", "--net", f"{project}_fleet",
                           "-v", f"{project}_node-0:/node:ro", IMAGE, "bash", "-c", """
            ssh_key=$(python3 -c "from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives import serialization as s
k = ec.generate_private_key(ec.SECP384R1()).public_key()
print(k.public_bytes(s.Encoding.OpenSSH, s.PublicFormat.OpenSSH).decode())")
            echo "$ssh_key" > /tmp/stranger.pub
            mkdir -p ~/.flwr && printf '%s\\n' '[superlink.proxy]' 'address = "proxy:9090"' \
              'root-certificates = "/node/ca.crt"' '[superlink.direct]' \
              'address = "superlink:9091"' 'root-certificates = "/node/ca.crt"' \
              > ~/.flwr/config.toml
            driftfl secure register proxy /tmp/stranger.pub --partition stranger.pub=0
            driftfl secure register direct /tmp/stranger.pub --partition stranger.pub=0
            getent hosts superlink || echo "superlink: no such host here"
            """, timeout=300)
        said = stranger.stdout + stranger.stderr
        assert "403 Forbidden" in said and "registered as node" not in said, said
        assert "superlink: no such host here" in said, said

        train = _compose(env, project, "exec", "operator", "driftfl-demo", "train",
                         "model=mlp", "rounds=2", timeout=900)
        assert train.returncode == 0, train.stdout[-4000:] + train.stderr[-4000:]
        runs = list((tmp_path / "runs").iterdir())
        assert len(runs) == 1 and (runs[0] / "summary.json").is_file(), train.stdout[-4000:]
        rows = json.loads((runs[0] / "metrics.json").read_text())["rounds"]
        assert [r["clients"] for r in rows[1:]] == [3, 3]
        assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.3, rows

        # each node: its own volume, read-only, and nothing else; what it trained on is its
        # own share of the split (the survey's histograms are those of the three files)
        shares = []
        for i in range(3):
            mounts = json.loads(_podman(env, "inspect", f"{project}_supernode-{i}_1",
                                        "--format", "{{json .Mounts}}").stdout)
            assert [(m["Name"], m["Destination"], m["RW"]) for m in mounts] == [
                (f"{project}_node-{i}", "/node", False)], mounts
            listing = _podman(env, "exec", f"{project}_supernode-{i}_1", "bash", "-c",
                              "ls /node; ls /usr/share/datasets 2>&1 | head -1").stdout
            assert listing.split()[:3] == ["ca.crt", "data.npz", "node.key"], listing
            assert "No such file" in listing
            volume = _podman(env, "volume", "inspect", f"{project}_node-{i}",
                             "--format", "{{.Mountpoint}}").stdout.strip()
            with np.load(Path(volume) / "data.npz") as share:
                shares.append(np.bincount(share["y"], minlength=10).tolist())
        clients = json.loads((runs[0] / "partition.json").read_text())["clients"]
        assert sorted(c["label_histogram"] for c in clients) == sorted(shares)
        assert sum(map(sum, shares)) == 6000 and all(c["partition_id"] == -1 for c in clients)
    finally:
        down = _compose(env, project, "down", "-v")
        left = _containers(env, project)
        volumes = _podman(env, "volume", "ls", "--format", "{{.Name}}").stdout.split()
        for net in ("setup", "private", "fleet"):
            _podman(env, "network", "rm", f"{project}_{net}")
    assert down.returncode == 0 and not left, down.stdout[-2000:] + "\n".join(left)
    assert not [v for v in volumes if v.startswith(project)], volumes
