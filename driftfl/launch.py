"""Run one experiment in local Ray simulation through a real `flwr run`.

The launcher owns a private simulation SuperLink for the run, which shields the user from
Flower's pitfalls (see ENVIRONMENT.md): runtime dependency installation is off, FLWR_HOME is a
scratch directory (so a user's own ~/.flwr and a background SuperLink are never touched), the
federation is sized from the experiment, logs are streamed, and the SuperLink is stopped after.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from pathlib import Path

from driftfl.common.config import ExperimentConfig
from driftfl.common.errors import ConfigError
from driftfl.common.paths import console_script

APP_DIR = Path(__file__).resolve().parents[1]  # holds pyproject.toml: the Flower app
CONNECTION = "driftfl-simulation"


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
    Flower 1.41's simulation settings have no address), else the one `ray start` recorded in
    <Ray's temporary folder>/ray_current_cluster, and else starts an instance of its own: only
    ``simulation.ray_address`` decides, never a RAY_ADDRESS left in the user's shell. A private
    instance keeps its sessions, sockets and that file under ``flwr_home`` (RAY_TMPDIR), never
    in the /tmp/ray that every other Ray on the machine shares: concurrent runs neither join
    nor disturb each other's Ray, and what Ray leaves goes with the run's scratch folder."""
    from driftfl.server.results import git_revision

    # The SuperLink starts further Flower executables by name: this environment's come first.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    else:
        env["RAY_TMPDIR"] = flwr_home
    return {**env, "PATH": path, "FLWR_HOME": flwr_home,
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "DRIFTFL_GIT_REVISION": git_revision(), "PYTHONUNBUFFERED": "1",
            # the clients' lines as they print them: Ray would fold lines alike across its
            # workers into "[repeated 4x across cluster]" (hiding all but one client's) and
            # colour the prefix that names the worker, which relay() takes off
            "RAY_DEDUP_LOGS": "0", "RAY_COLOR_PREFIX": "0",
            # Ray's start-up tip about a future default says nothing about this run
            "PYTHONWARNINGS": ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"),
                                                      "ignore:Tip:FutureWarning"]))}


def run_config_arg(overrides: list[str], run_dir: Path, resume: bool = False,
                   launched: float = 0.0) -> str:
    """The ServerApp's run config (pyproject.toml's [tool.flwr.app.config]); ``launched``:
    when this command started, on the ServerApp's clock (simulation: this machine's)."""
    encoded = json.dumps(overrides)
    if "'" in encoded or "'" in str(run_dir):
        raise ConfigError("overrides and output paths cannot contain single quotes (')")
    return (f"overrides='{encoded}' run-dir='{run_dir}'" + (" resume=true" if resume else "")
            + (f" launched={launched!r}" if launched else ""))


def check_launch(overrides: list[str], run_dir: Path, ray_address: str | None = None) -> None:
    """Refuse what launch_simulation could not run, before anything is written."""
    console_script("flower-superlink")
    console_script("flwr")
    run_config_arg(overrides, run_dir)
    check_ray_address(ray_address)


def check_ray_address(ray_address: str | None) -> None:
    """Refuse a Ray cluster that does not answer (None and "auto": nothing to check)."""
    if not ray_address or ray_address == "auto":
        return
    host, port = ray_address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        raise ConfigError(
            f"no Ray cluster answers at simulation.ray_address={ray_address} ({err}); start "
            f"one with `ray start --head --port={port}` on {host}, or drop the setting "
            "to run on a private Ray instance") from None


def check_destination(cfg: ExperimentConfig) -> None:
    """Refuse a run whose federation (``superlink``) or Ray cluster cannot be reached from
    here, so that a sweep is refused before Hydra writes its directory."""
    if cfg.superlink:
        check_connection(cfg.superlink)
    else:
        check_ray_address(cfg.simulation.ray_address)


@contextlib.contextmanager
def app_bundle(scratch: str | None = None):
    """A scratch copy of the Flower app (in ``scratch``, else the temporary folder):
    pyproject.toml and the files its ``fab-include`` names. `flwr run` reads every file under
    the folder it is given before it filters them, and a .venv inside the repository holds some
    50,000 (2-3 s a run); the bundle it builds from the copy is the same, byte for byte."""
    with open(APP_DIR / "pyproject.toml", "rb") as f:
        patterns = tomllib.load(f)["tool"]["flwr"]["app"]["fab-include"]
    with tempfile.TemporaryDirectory(prefix="driftfl-app-", dir=scratch) as copy:
        for path in ["pyproject.toml", *{str(p.relative_to(APP_DIR)) for pattern in patterns
                                         for p in APP_DIR.glob(pattern) if p.is_file()}]:
            (Path(copy) / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(APP_DIR / path, Path(copy) / path)
        yield Path(copy)


def follow(args: list[str], env: dict[str, str], verbose: bool,
           scratch: str | None = None) -> bool:
    """Run `flwr run <app> <args>` (``<app>``: a copy of the app, see app_bundle; ``args``
    with --stream), printing its lines as they come (Flower's and Ray's noise left out unless
    ``verbose``) until the run's closing results line: what Flower does after it (shutting Ray
    down, closing the stream) takes seconds and changes nothing. True when that line came.
    `flwr run`'s exit code tells nothing (0 whatever became of the run): the run directory
    does."""
    from driftfl.quiet import relay
    from driftfl.server.console import RESULTS

    with app_bundle(scratch) as app, subprocess.Popen(
            [console_script("flwr"), "run", str(app), *args], env=env, cwd=APP_DIR,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as flwr:
        try:
            return relay(flwr.stdout, verbose, last=RESULTS)
        finally:
            if flwr.poll() is None:  # done, or stopped by Ctrl-C or SIGTERM: it only streams
                flwr.terminate()


def start_watchdog(flwr_home: str) -> subprocess.Popen:
    """A process that ends the run's processes should this one die untidily (SIGKILL): see
    watchdog.py. In a session of its own, so that Ctrl-C reaches only the launcher."""
    env = {k: v for k, v in os.environ.items() if k != "FLWR_HOME"}
    return subprocess.Popen([sys.executable, str(Path(__file__).with_name("watchdog.py")),
                             str(os.getpid()), flwr_home], env=env, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through `finally`, which stops the SuperLink


def _start_superlink(flwr_home: str, env: dict[str, str], log_path: Path,
                     resume: bool) -> subprocess.Popen:
    """The private simulation SuperLink, healthy, on a free port named in flwr_home's config.
    A port found free can be taken before the SuperLink binds it (a parallel sweep job's Ray
    starts dozens of servers): then it exits, and it starts again on another."""
    for attempt in range(3):
        port = free_port()
        (Path(flwr_home) / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{port}"\ninsecure = true\n')
        with open(log_path, "a" if resume or attempt else "w") as log:
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


def launch_simulation(cfg: ExperimentConfig, overrides: list[str], run_dir: Path,
                      resume: bool = False) -> int:
    """Run the experiment (``resume``: go on with the stopped run in ``run_dir``); 0 when it
    completed and wrote its results to ``run_dir``. Ctrl-C or a SIGTERM stops the SuperLink
    (and the Ray workers under it) too, and says how to resume."""
    launched = time.time()  # the run's start-up counts from here
    check_launch(overrides, run_dir, cfg.simulation.ray_address)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "superlink.log"
    # ignore_cleanup_errors: a Ray process killed last may still write its log as it goes
    with tempfile.TemporaryDirectory(prefix="driftfl-flower-",
                                     ignore_cleanup_errors=True) as flwr_home:
        env = flwr_env(flwr_home, cfg.simulation.ray_address)
        superlink, finished = None, False
        watchdog = start_watchdog(flwr_home)
        try:
            superlink = _start_superlink(flwr_home, env, log_path, resume)
            federation = (f"num_supernodes={cfg.num_clients} "
                          f"client_resources_num_cpus={cfg.simulation.client_cpus} "
                          f"client_resources_num_gpus={cfg.simulation.client_gpus}")
            finished = follow([CONNECTION, "--run-config", run_config_arg(overrides, run_dir,
                                                                          resume, launched),
                               "--federation-config", federation, "--stream"], env, cfg.verbose,
                              scratch=flwr_home)  # the watchdog removes it after a SIGKILL
        except (SystemExit, KeyboardInterrupt) as stopped:  # `finally` stops the SuperLink
            print(f"driftfl: stopped; {saved(run_dir, overrides)}", file=sys.stderr)
            # one line, no traceback: Ctrl-C exits 130 as a shell expects
            code = stopped.code if isinstance(stopped, SystemExit) else 128 + signal.SIGINT
            raise SystemExit(code) from None
        finally:
            # a finished run has written every file: what Ray and Flower would tidy on a
            # SIGTERM (4-6 s of it) is of no use, so the rest is killed after a second
            if superlink:
                stop(superlink, grace=1 if finished else 15)
            watchdog.kill()  # nothing of the run is left for it to end
            watchdog.wait()
    if finished_status(run_dir):
        return 0
    print(not_completed(run_dir, overrides, f"see the log above and {log_path}"),
          file=sys.stderr)
    return 1


def finished_status(run_dir: Path) -> bool:
    """Whether the run wrote its results: status completed, or incomplete (it trained, but
    some round got no usable reply or too few clients were left; the ServerApp printed why).
    A failed run (no round trained, or stopped) is not."""
    summary = run_dir / "summary.json"
    return summary.is_file() and json.loads(summary.read_text()).get("status") in (
        "completed", "incomplete")


def check_connection(name: str) -> None:
    """Refuse a SuperLink connection flwr does not know, listing the ones it does."""
    from driftfl.deploy.connection import require_connection

    try:
        require_connection(name)
    except ConfigError as err:
        raise ConfigError(f"superlink={name}: {err}") from None


def launch_deployment(cfg: ExperimentConfig, overrides: list[str], run_dir: Path,
                      resume: bool = False) -> int:
    """Run the experiment on the deployed federation that ``cfg.superlink`` names, following
    its log; 0 when it completed. The ServerApp writes ``run_dir`` on the SuperLink's machine:
    this command checks it there (the same machine, or a shared folder)."""
    check_connection(cfg.superlink)
    env = {**os.environ, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    try:
        follow([cfg.superlink, "--stream",
                "--run-config", run_config_arg(overrides, run_dir, resume)], env, cfg.verbose)
    except KeyboardInterrupt:
        print(f"driftfl: stopped following the run; it may go on in the federation "
              f"(flwr ls {cfg.superlink}; flwr stop <run id> {cfg.superlink})", file=sys.stderr)
        raise SystemExit(128 + signal.SIGINT) from None
    if finished_status(run_dir):
        return 0
    print(not_completed(run_dir, overrides, "if the SuperLink stopped, start it again with the "
                        "same --database: the nodes reconnect"), file=sys.stderr)
    return 1


def not_completed(run_dir: Path, overrides: list[str], advice: str) -> str:
    """Why a run that wrote no completed summary.json did not, and what is saved of it."""
    summary = run_dir / "summary.json"
    if summary.is_file():  # failed: the ServerApp printed why and what to change
        return f"driftfl: the run failed; its summary.json and rounds are in {run_dir}"
    return (f"driftfl: the run did not complete (no summary.json in {run_dir}); {advice}.\n"
            f"driftfl: {saved(run_dir, overrides)}")


def saved(run_dir: Path, overrides: list[str]) -> str:
    """What ``run_dir`` holds of a stopped run, as the run directory says: its results (the
    server had finished), the checkpoint of its last complete round and how to go on from
    there, or nothing."""
    from driftfl.server.checkpoint import CHECKPOINT, saved_round

    summary = run_dir / "summary.json"
    if summary.is_file():
        status = json.loads(summary.read_text()).get("status")
        return f"the run had finished ({status}); its results are in {run_dir}"
    found = saved_round(run_dir)
    if found is None:
        return ("nothing was saved: it stopped before its first round ended"
                if not (run_dir / CHECKPOINT).is_file()
                else f"its {CHECKPOINT} cannot be read, so it cannot be resumed")
    done, rounds = found
    if done >= rounds:
        return f"all {rounds} rounds are saved in {run_dir / CHECKPOINT}, but not its results"
    # resume=DIR alone takes the overrides driftfl run saved there (resume.ran_with)
    again = "" if (run_dir / ".hydra" / "overrides.yaml").is_file() else " ".join(
        shlex.quote(o) for o in overrides if not o.startswith("hydra.run.dir="))
    return (f"it is saved after round {done} of {rounds}, go on with: driftfl run {again} "
            f"resume={shlex.quote(str(run_dir))}").replace("  ", " ")
