"""A real deployment on 127.0.0.1 for the e2e tests: a SuperLink and its SuperNodes as processes,
started with the README's commands (TLS, node authentication, the fleet proxy; or README's
--insecure shortcut), each stopped when the test (or the module sharing it) is done."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from pathlib import Path

from conftest import REPO, driftfl_bin
from driftfl.common.paths import console_script
from driftfl.deploy.credentials import make_credentials
from driftfl.host import _wait_healthy, flwr_env, free_port, stop


class Deployment:
    """A SuperLink and its SuperNodes as processes; calling it runs `flwr run <overrides>`.

    Secure (the default, as README leads): credentials from `driftfl secure init`, a SuperLink
    with TLS and node authentication on 127.0.0.1, the node keys registered through it, and
    the fleet proxy (`driftfl secure proxy`) as the nodes' only door. ``secure=False`` is
    README's local shortcut: --insecure, the nodes straight to the SuperLink."""

    def __init__(self, node_configs: list[str], logs: Path, flwr_home: str, secure: bool = True):
        self.node_configs, self.logs, self.secure = node_configs, logs, secure
        self.port = free_port()
        self.fleet = free_port() if secure else self.port  # where nodes connect
        self.keys = logs / "secure"
        if secure:  # one key more than nodes: a node nobody registered
            make_credentials(self.keys, [], nodes=len(node_configs) + 1)
        (Path(flwr_home) / "config.toml").write_text(
            f'[superlink.deployment]\naddress = "127.0.0.1:{self.port}"\n' + (
                f'root-certificates = "{self.keys / "ca.crt"}"\n' if secure
                else "insecure = true\n"))
        self.env = flwr_env(flwr_home)
        self.processes: list[subprocess.Popen] = []
        self.nodes: dict[int, subprocess.Popen] = {}

    def start(self, cmd: list[str], name: str, mode: str = "w") -> subprocess.Popen:
        with open(self.logs / f"{name}.log", mode) as log:
            self.processes.append(subprocess.Popen(cmd, env=self.env, stdout=log,
                                                   stderr=subprocess.STDOUT,
                                                   start_new_session=True))
        return self.processes[-1]

    def start_superlink(self) -> None:
        """The SuperLink, its state in a database file: a restarted one knows its nodes."""
        tls = ["--ssl-ca-certfile", str(self.keys / "ca.crt"), "--ssl-certfile",
               str(self.keys / "superlink.crt"), "--ssl-keyfile", str(self.keys / "superlink.key"),
               "--enable-supernode-auth"] if self.secure else ["--insecure"]
        self.superlink = self.start(
            [console_script("flower-superlink"), *tls, "--host", "127.0.0.1", "--port",
             str(self.port), "--database", str(self.logs / "superlink.db"),
             "--disable-runtime-dependency-installation"], "superlink", "a")
        _wait_healthy(self.port, self.superlink, self.logs / "superlink.log",
                      ca=self.keys / "ca.crt" if self.secure else None)

    def open_fleet(self) -> None:
        """Register the nodes' keys (the operator, on 127.0.0.1), then open the nodes' door."""
        keys = [str(self.keys / f"node-{i}.key.pub") for i in range(len(self.node_configs))]
        out = subprocess.run([driftfl_bin(), "secure", "register", "deployment", *keys],
                             env=self.env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        self.proxy = self.start([driftfl_bin(), "secure", "proxy", str(self.keys), "--listen",
                                 f"127.0.0.1:{self.fleet}", "--superlink",
                                 f"127.0.0.1:{self.port}"], "proxy")

    def node_command(self, key: str | None, insecure: bool = False) -> list[str]:
        tls = (["--insecure"] if insecure or not self.secure
               else ["--root-certificates", str(self.keys / "ca.crt")])
        auth = ["--auth-supernode-private-key", str(self.keys / key)] if key else []
        return [console_script("flower-supernode"), *tls, *auth, "--superlink",
                f"127.0.0.1:{self.fleet}", "--port", str(free_port())]

    def start_node(self, i: int) -> None:
        """SuperNode i (again, after a kill: a new process, which gets a new node id)."""
        key = f"node-{i}.key" if self.secure else None
        self.nodes[i] = self.start([*self.node_command(key), "--node-config",
                                    self.node_configs[i]], f"supernode{i}", "a")

    def kill(self, i: int) -> None:
        """SIGKILL SuperNode i and the ClientApp it may be running, as a machine that dies."""
        os.killpg(self.nodes[i].pid, signal.SIGKILL)
        self.nodes[i].wait()

    def command(self, overrides: str, run_dir: Path) -> list[str]:
        return [console_script("flwr"), "run", str(REPO), "deployment", "--stream", "--run-config",
                f"overrides='{overrides}' run-dir='{run_dir}'"]

    def __call__(self, overrides: str, run_dir: Path) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(overrides, run_dir), env=self.env,
                              capture_output=True, text=True, timeout=900)


@contextlib.contextmanager
def deployment(node_configs: list[str], logs: Path, secure: bool = True):
    """A SuperLink and one SuperNode per node config; yields the Deployment. Every process it
    started is stopped."""
    with tempfile.TemporaryDirectory() as flwr_home:
        cluster = Deployment(node_configs, logs, flwr_home, secure)
        try:
            cluster.start_superlink()
            if secure:
                cluster.open_fleet()
            for i in range(len(node_configs)):
                cluster.start_node(i)
            yield cluster
        finally:
            for process in reversed(cluster.processes):
                stop(process)
            assert all(p.poll() is not None for p in cluster.processes)  # nothing left running
