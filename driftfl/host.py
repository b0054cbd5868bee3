"""Where `driftfl run` simulates: a private SuperLink and a private Ray instance, started once and
kept for every job of a sweep.

A run's start-up was mostly processes starting: Ray (its GCS, raylet and agents), the SuperLink,
then the run's own. A ``SimulationHost`` starts Ray (ray_head.py: ``ray.init()`` as Flower's
engine would, its sessions and sockets in the host's scratch FLWR_HOME) and the SuperLink once;
each run is a `flwr run` submitted to it, whose simulation joins that Ray instance (RAY_ADDRESS)
instead of starting one. A lone run has a host of its own, stopped when it ends; a sweep's jobs
share one (``shared_hosts``), stopped when the sweep ends. A process that started a host can
lend it to the processes it starts: with DRIFTFL_HOST naming the host's FLWR_HOME, a `driftfl
run` submits to that host and leaves it running (``SimulationHost.attach``: the workers of a
parallel sweep, hydra/launcher=joblib, Optuna's parallel trials among them; the test suite's
simulation runs), the runs taking turns on it (``SimulationHost.turn``).
``simulation.ray_address`` names a cluster to join instead of starting Ray. What a run computes
does not depend on it: the same settings give the same bytes whether run alone or in a sweep
(tests/e2e/test_e2e_sweep.py).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from driftfl.common.paths import console_script

APP_DIR = Path(__file__).resolve().parents[1]  # holds pyproject.toml: the Flower app
CONNECTION = "driftfl-simulation"
RAY_READY = "Ray runtime started"  # ray_head.py's line, before the address
# seconds to wait for Ray to say it started, per try: Ray gives its raylet 30 s to
# register, which a loaded machine can miss, and a second try often makes it
RAY_WAITS = (90, 180)


# a started host's FLWR_HOME: a `driftfl run` in an environment that names one submits to it
HOST_ENV = "DRIFTFL_HOST"
HOST_FILE = "host.json"  # in the host's FLWR_HOME: its Ray address and log, for who attaches


class HostFailed(RuntimeError):
    """The SuperLink or Ray could not start: the message is one line with the cause."""


class SimulationHost:
    """A private SuperLink (and Ray instance, unless ``ray_address`` names a cluster) that
    runs are submitted to; ``log``: the file the processes write to."""

    def __init__(self, ray_address: str | None, log: Path, flwr_home: str | None = None):
        self.ray_address, self.log = ray_address, log
        self.flwr_home = flwr_home or tempfile.mkdtemp(prefix="driftfl-flower-")
        self.ray: subprocess.Popen | None = None
        self.own_ray_address = ""  # the Ray instance this host started
        self.superlink: subprocess.Popen | None = None
        self.watchdog = None
        self.env: dict[str, str] = {}
        self.attached = False  # another process's host: neither started nor stopped here

    @classmethod
    def attach(cls, flwr_home: str) -> SimulationHost:
        """The host another process started, whose FLWR_HOME is ``flwr_home``; HostFailed in
        one line where it is not a running host."""
        try:
            found = json.loads((Path(flwr_home) / HOST_FILE).read_text())
        except (OSError, ValueError):
            raise HostFailed(f"{HOST_ENV}={flwr_home} names no running driftfl host (no "
                             f"{HOST_FILE} there); unset {HOST_ENV}") from None
        host = cls(found["ray_address"], Path(found["log"]), flwr_home)
        host.attached = True
        host.env = flwr_env(flwr_home, found["own_ray_address"] or found["ray_address"])
        return host

    def start(self, resume: bool = False) -> None:
        """Start what is not running yet (``resume``: a resumed run's log is appended to),
        saying each stage as it happens."""
        if self.attached:  # its owner keeps it running
            return
        if self.watchdog is None:
            self.watchdog = start_watchdog(self.flwr_home)
            self.log.parent.mkdir(parents=True, exist_ok=True)
            if not resume:
                self.log.write_text("")
        address = self.ray_address
        if not address:
            if self.ray is None or self.ray.poll() is not None:
                started = time.monotonic()
                say("starting Ray")
                self.ray, self.own_ray_address = start_ray(self.flwr_home, self.log)
                say(f"Ray is up ({time.monotonic() - started:.1f} s)")
            address = self.own_ray_address
        if self.env.get("RAY_ADDRESS") not in (None, address) and self.superlink is not None:
            stop(self.superlink)  # it would start runs on the Ray instance that is gone
            self.superlink = None
        self.env = flwr_env(self.flwr_home, address)
        if self.superlink is None or self.superlink.poll() is not None:
            started = time.monotonic()
            say("starting the SuperLink")
            try:
                self.superlink = start_superlink(self.flwr_home, self.env, self.log)
            except RuntimeError as err:
                raise HostFailed(str(err)) from None
            say(f"the SuperLink is up ({time.monotonic() - started:.1f} s)")
        (Path(self.flwr_home) / HOST_FILE).write_text(json.dumps({
            "ray_address": self.ray_address, "own_ray_address": self.own_ray_address,
            "log": str(self.log)}))

    @contextlib.contextmanager
    def turn(self):
        """While open, this process's run is the only one on an attached host: Flower's Ray
        backend places a run's client actors one by one, so two runs sharing a Ray instance
        too small for both could each hold part of their actors and wait for the rest for
        ever. A run submitted meanwhile waits here (its start-up up to this point overlaps);
        a host of this process's own needs no turn (its sweep runs one job at a time)."""
        if not self.attached:
            yield
            return
        import fcntl

        with open(Path(self.flwr_home) / "turn.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say("waiting for the run before this one on the shared host")
                fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def stop_run(self, run_id: str, timeout: float = 30) -> None:
        """Stop one run on this host (an attached host goes on for its owner's other runs),
        waiting up to ``timeout`` seconds until the SuperLink has it finished."""
        flwr = console_script("flwr")
        subprocess.run([flwr, "stop", run_id, CONNECTION], env=self.env, capture_output=True,
                       timeout=60)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            listed = subprocess.run([flwr, "ls", CONNECTION, "--run-id", run_id, "--format",
                                     "json"], env=self.env, capture_output=True, text=True,
                                    timeout=60)
            if '"finished' in listed.stdout or listed.returncode:
                return
            time.sleep(0.5)

    def close(self, quick: bool = False) -> None:
        """Stop the SuperLink and Ray, and everything under them (``quick``: every run is over
        and wrote its files, so what is left is killed after a second); an attached host is its
        owner's to stop."""
        if self.attached:
            return
        grace = 1 if quick else 15
        for process in (self.superlink, self.ray):
            if process is not None:
                stop(process, grace=grace)
        self.superlink = self.ray = None
        if self.watchdog is not None:
            self.watchdog.kill()  # nothing of the runs is left for it to end
            self.watchdog.wait()
            self.watchdog = None
        shutil.rmtree(self.flwr_home, ignore_errors=True)


def say(stage: str) -> None:
    print(f"driftfl: {stage}", flush=True)


def start_ray(flwr_home: str, log: Path) -> tuple[subprocess.Popen, str]:
    """A private Ray instance whose sessions live in ``flwr_home`` (so no other Ray on the
    machine finds or joins it), and its address; HostFailed with the cause after a second
    try."""
    for attempt, wait in enumerate(RAY_WAITS):
        with open(log, "a") as out:
            out.write(f"--- ray start (waiting up to {wait} s)\n")
            out.flush()
            # FLWR_HOME: the watchdog ends every process that carries the host's (a SIGKILL)
            env = {**os.environ, "RAY_TMPDIR": flwr_home, "FLWR_HOME": flwr_home,
                   "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
            env.pop("RAY_ADDRESS", None)
            ray = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("ray_head.py")), flwr_home],
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        try:
            address, cause = wait_ready(ray, log, wait)
        except BaseException:  # Ctrl-C or SIGTERM while it starts
            stop(ray)
            raise
        if address:
            return ray, address
        stop(ray)
        if attempt + 1 < len(RAY_WAITS):
            say(f"Ray did not start ({cause}); trying again")
    raise HostFailed(f"Ray did not start: {cause}; the machine may be too busy (see {log})")


def wait_ready(ray: subprocess.Popen, log: Path, timeout: float) -> tuple[str, str]:
    """(Ray's address, "") once ``ray`` says it started; else ("", why not, in a few words)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        tail = text[text.rfind("--- ray start"):]
        if found := re.search(rf"^{RAY_READY} (\S+)$", tail, re.M):
            return found.group(1), ""
        if ray.poll() is not None:
            return "", f"Ray exited with code {ray.returncode}: {last_error(tail)}"
        time.sleep(0.2)
    return "", f"not ready within {timeout:g} s"


def last_error(text: str) -> str:
    """The last line of ``text`` that names an error (else its last line), shortened."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"error|exception|failed", line, re.I)]
    found = (errors or lines or ["no output"])[-1]
    return found[:200]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(port: int, process: subprocess.Popen, log: Path, timeout: float = 60,
                  ca: Path | None = None) -> None:
    """Wait until the SuperLink on 127.0.0.1:``port`` answers its health check (over TLS,
    trusting ``ca``, when given)."""
    import ssl

    deadline = time.monotonic() + timeout
    url = f"{'https' if ca else 'http'}://127.0.0.1:{port}/health"
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with code {process.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as r:
                if r.status == 200:
                    return
        except (OSError, http.client.HTTPException):  # not up yet, or another's port
            pass
        time.sleep(0.3)
    raise RuntimeError(f"flower-superlink did not become ready in {timeout:.0f} s; see {log}")


def stop(process: subprocess.Popen, grace: float = 15) -> None:
    """Stop a process and everything below it: SIGTERM, and SIGKILL to what is left after
    ``grace`` seconds. Flower starts flwr-simulation, and Ray its workers, in sessions of their
    own, so a process group is not enough: walk the tree."""
    import psutil

    from driftfl.watchdog import terminate

    try:
        root = psutil.Process(process.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    terminate(tree, grace)
    process.wait()


def flwr_env(flwr_home: str, ray_address: str | None = None) -> dict[str, str]:
    """The environment of the private SuperLink and everything it starts. Flower's Ray backend
    calls ``ray.init()``, which joins the cluster that RAY_ADDRESS names (Ray's own variable;
    Flower's simulation settings have no address): the host's own Ray (``start_ray``) or the
    cluster ``simulation.ray_address`` names, never a RAY_ADDRESS left in the user's shell.
    Without one it would start an instance of its own, keeping its sessions, sockets and
    ray_current_cluster under ``flwr_home`` (RAY_TMPDIR), never in the /tmp/ray that every
    other Ray on the machine shares: concurrent runs neither join nor disturb each other's
    Ray, and what Ray leaves goes with the run's scratch folder. No telemetry leaves: Flower's
    and flwr-datasets' events are off unless the user's environment turns them on."""
    from driftfl.server.results import git_revision

    # The SuperLink starts further Flower executables by name: this environment's come first.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    else:
        env["RAY_TMPDIR"] = flwr_home
    return {"FLWR_TELEMETRY_ENABLED": "0", **env, "PATH": path, "FLWR_HOME": flwr_home,
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "DRIFTFL_GIT_REVISION": git_revision(), "PYTHONUNBUFFERED": "1",
            # the clients' lines as they print them: Ray would fold lines alike across its
            # workers into "[repeated 4x across cluster]" (hiding all but one client's) and
            # colour the prefix that names the worker, which relay() takes off
            "RAY_DEDUP_LOGS": "0", "RAY_COLOR_PREFIX": "0",
            # Ray's start-up tip about a future default says nothing about this run
            "PYTHONWARNINGS": ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"),
                                                      "ignore:Tip:FutureWarning"]))}


def start_watchdog(flwr_home: str) -> subprocess.Popen:
    """A process that ends the run's processes should this one die untidily (SIGKILL): see
    watchdog.py. In a session of its own, so that Ctrl-C reaches only the launcher."""
    env = {k: v for k, v in os.environ.items() if k != "FLWR_HOME"}
    return subprocess.Popen([sys.executable, str(Path(__file__).with_name("watchdog.py")),
                             str(os.getpid()), flwr_home], env=env, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def start_superlink(flwr_home: str, env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """The private simulation SuperLink, healthy, on a free port named in flwr_home's config.
    A port found free can be taken before the SuperLink binds it (a parallel sweep job's Ray
    starts dozens of servers): then it exits, and it starts again on another."""
    for attempt in range(3):
        port = free_port()
        (Path(flwr_home) / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{port}"\ninsecure = true\n')
        with open(log_path, "a") as log:
            superlink = subprocess.Popen(
                [console_script("flower-superlink"), "--insecure", "--simulation",
                 "--disable-runtime-dependency-installation", "--host", "127.0.0.1",
                 "--port", str(port)],
                env=env, cwd=APP_DIR, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        try:
            _wait_healthy(port, superlink, log_path)
            return superlink
        except RuntimeError:
            exited = superlink.poll() is not None
            stop(superlink)
            if not exited or attempt == 2:
                raise
        except BaseException:  # Ctrl-C or SIGTERM while it starts
            stop(superlink)
            raise
    raise AssertionError("unreachable")


_shared: dict[str | None, SimulationHost] | None = None  # the sweep's hosts, by Ray address


@contextlib.contextmanager
def shared_hosts(lend: Path | None = None):
    """While open, ``host_for`` hands every run of this process one host per Ray address,
    stopped when it closes. ``lend`` (the host's log): the runs are in other processes this
    one starts (a parallel launcher's workers), so a local host is started now and lent to
    them (DRIFTFL_HOST), unless one is lent to this process already; they take turns on it."""
    global _shared
    _shared = {}
    lent = None
    if lend is not None and not os.environ.get(HOST_ENV):
        lent = _shared[None] = SimulationHost(None, lend)
        lent.start()
        os.environ[HOST_ENV] = lent.flwr_home  # the workers start after this
    try:
        yield
    finally:
        if lent is not None:
            os.environ.pop(HOST_ENV, None)
        hosts, _shared = _shared, None
        for host in hosts.values():
            host.close(quick=True)


def host_for(ray_address: str | None, run_log: Path) -> tuple[SimulationHost, bool]:
    """The host a run goes to, and whether it is shared (else the run stops it). A shared
    host's processes log beside the sweep's job directories (``run_log``: <job dir>/<name>);
    the host DRIFTFL_HOST names, when the run joins no Ray cluster of its own."""
    if (lent := os.environ.get(HOST_ENV)) and ray_address is None:
        return SimulationHost.attach(lent), True
    if _shared is None:
        return SimulationHost(ray_address, run_log), False
    if ray_address not in _shared:
        _shared[ray_address] = SimulationHost(ray_address, run_log.parent.parent / run_log.name)
    return _shared[ray_address], True

