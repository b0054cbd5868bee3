"""Run one experiment in local Ray simulation through a real `flwr run`.

The launcher owns a private simulation SuperLink for the run, which shields the user from
Flower's pitfalls (see ENVIRONMENT.md): runtime dependency installation is off, FLWR_HOME is a
scratch directory (so a user's own ~/.flwr and a background SuperLink are never touched), the
federation is sized from the experiment, logs are streamed, and the SuperLink is stopped after.
"""

from __future__ import annotations

import contextlib
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
from pathlib import Path

from driftfl.common.config import ExperimentConfig
from driftfl.common.errors import ConfigError
from driftfl.common.paths import console_script

from driftfl.host import APP_DIR, CONNECTION
from driftfl.resume import STOPPED


def run_config_arg(overrides: list[str], run_dir: Path, resume: bool = False,
                   launched: float = 0.0, mlflow: bool = False) -> str:
    """The ServerApp's run config (pyproject.toml's [tool.flwr.app.config]); ``launched``:
    when this command started, on the ServerApp's clock (simulation: this machine's);
    ``mlflow``: the MLflow store and experiment this command chose (server.tracker), which a
    ServerApp started by a shared host's SuperLink does not have in its environment."""
    encoded = json.dumps(overrides)
    store = {"mlflow-uri": os.environ.get("MLFLOW_TRACKING_URI", ""),
             "mlflow-experiment": os.environ.get("MLFLOW_EXPERIMENT_NAME", "")} if mlflow else {}
    if "'" in encoded or "'" in str(run_dir) or any("'" in v for v in store.values()):
        raise ConfigError("overrides and output paths cannot contain single quotes (')")
    return (f"overrides='{encoded}' run-dir='{run_dir}'" + (" resume=true" if resume else "")
            + (f" launched={launched!r}" if launched else "")
            + "".join(f" {key}='{value}'" for key, value in store.items() if value))


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
           scratch: str | None = None, seen: dict | None = None) -> bool:
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
            return relay(flwr.stdout, verbose, last=RESULTS, seen=seen)
        finally:
            if flwr.poll() is None:  # done, or stopped by Ctrl-C or SIGTERM: it only streams
                flwr.terminate()


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through `finally`, which stops the SuperLink


def launch_simulation(cfg: ExperimentConfig, overrides: list[str], run_dir: Path,
                      resume: bool = False) -> int:
    """Run the experiment (``resume``: go on with the stopped run in ``run_dir``) on a private
    SuperLink and Ray (a sweep's jobs share theirs: driftfl.host); its exit code (EXIT_CODES):
    0 when it completed and wrote its results to ``run_dir``. Ctrl-C or a SIGTERM stops the
    SuperLink (and the Ray workers under it) too, and says how to resume."""
    from driftfl.host import HostFailed, host_for
    from driftfl.quiet import say

    launched = time.time()  # the run's start-up counts from here
    check_launch(overrides, run_dir, cfg.simulation.ray_address)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"driftfl: run directory {run_dir}", flush=True)
    host, shared = host_for(cfg.simulation.ray_address, run_dir / "superlink.log")
    finished = False
    seen: dict[str, str] = {}  # the run's id, once Flower says it
    try:
        host.start(resume)
        federation = (f"num_supernodes={cfg.num_clients} "
                      f"client_resources_num_cpus={cfg.simulation.client_cpus} "
                      f"client_resources_num_gpus={cfg.simulation.client_gpus}")
        print("driftfl: submitting the run (the ServerApp loads the data, Ray starts the "
              "clients)", flush=True)
        with host.turn():
            finished = follow([CONNECTION, "--run-config", run_config_arg(
                                   overrides, run_dir, resume, launched,
                                   mlflow=cfg.tracker == "mlflow"),
                               "--federation-config", federation, "--stream"], host.env,
                              cfg.verbose, scratch=host.flwr_home,  # the watchdog removes it
                              seen=seen)
    except HostFailed as err:
        print(f"driftfl: error: {err}", file=sys.stderr)
        return EXIT_CODES["failed"]
    except (SystemExit, KeyboardInterrupt) as stopped:
        # the run's process ends before its directory is read: a stop that lands while the
        # last rounds finish must not report the checkpoint it was about to overwrite (a
        # sweep's shared host goes too: the sweep stops here)
        host.close()
        if host.attached and "run_id" in seen:  # the host goes on: only this run stops
            host.stop_run(seen["run_id"])
        line = f"driftfl: stopped; {saved(run_dir, overrides)}"
        # the run directory keeps the line (a resume removes it): the terminal may be gone
        with contextlib.suppress(OSError):
            (run_dir / STOPPED).write_text(line + "\n")
        say(line)  # through a closed pipe too
        # one line, no traceback: Ctrl-C exits 130 as a shell expects
        code = stopped.code if isinstance(stopped, SystemExit) else 128 + signal.SIGINT
        raise SystemExit(code) from None
    finally:
        # a finished run has written every file: what Ray and Flower would tidy on a
        # SIGTERM (4-6 s of it) is of no use, so the rest is killed after a second (a stopped
        # one's host is closed already: closing again does nothing)
        if not shared:
            host.close(quick=finished)
    return run_outcome(run_dir, overrides, f"see the log above and {host.log}")


def run_outcome(run_dir: Path, overrides: list[str], advice: str) -> int:
    """The exit code of the run in ``run_dir`` (EXIT_CODES), with a line on stderr unless it
    completed."""
    status = run_status(run_dir)
    if status == "completed":
        return 0
    if status == "incomplete":
        print(f"driftfl: the run is incomplete (exit code {EXIT_CODES['incomplete']}): its "
              f"results are in {run_dir}, and summary.json says what it lacks", file=sys.stderr)
        return EXIT_CODES["incomplete"]
    print(not_completed(run_dir, overrides, advice), file=sys.stderr)
    return EXIT_CODES["failed"]


# `driftfl run`'s exit codes (docs/running.md); 2: the command was refused, nothing ran;
# 130/143: stopped by Ctrl-C/SIGTERM
EXIT_CODES = {"completed": 0, "failed": 1, "incomplete": 3}


def run_status(run_dir: Path) -> str | None:
    """The status summary.json gives the run (completed, incomplete, failed); None without
    one."""
    summary = run_dir / "summary.json"
    if not summary.is_file():
        return None
    return json.loads(summary.read_text()).get("status")


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
    seen: dict[str, str] = {}
    try:
        follow([cfg.superlink, "--stream",
                "--run-config", run_config_arg(overrides, run_dir, resume)], env, cfg.verbose,
               seen=seen)
    except KeyboardInterrupt:
        print(stopped_following(cfg.superlink, seen.get("run_id")), file=sys.stderr)
        raise SystemExit(128 + signal.SIGINT) from None
    return run_outcome(run_dir, overrides, "if the SuperLink stopped, start it again with the "
                       "same --database: the nodes reconnect")


def stopped_following(superlink: str, run_id: str | None) -> str:
    """What Ctrl-C during a deployed run says: the run goes on in the federation, and how to
    stop it (its id, when Flower had said it)."""
    if run_id is None:
        return (f"driftfl: stopped following the run; it may go on in the federation: find it "
                f"with `flwr ls {superlink}`, stop it with `flwr stop <run id> {superlink}`")
    return (f"driftfl: stopped following run {run_id}; it goes on in the federation. Stop it "
            f"with: flwr stop {run_id} {superlink}")


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
    there, or nothing. Read once the run's process has ended (``launch_simulation``)."""
    from driftfl.server.checkpoint import CHECKPOINT, saved_round

    summary = run_dir / "summary.json"
    if summary.is_file():
        try:
            status = json.loads(summary.read_text()).get("status")
        except (OSError, ValueError, AttributeError):
            return f"its summary.json cannot be read; what the run wrote is in {run_dir}"
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
