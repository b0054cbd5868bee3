"""The watchdog of `driftfl run`'s private simulation: when the launcher dies without tidying
up (SIGKILL, the OOM killer), it ends every process of the run and removes its FLWR_HOME.

A process group or PR_SET_PDEATHSIG cannot do this: Flower starts flower-superexec and
flwr-simulation in sessions of their own, Ray's gcs_server, raylet and workers hang below
those, and a death signal to the SuperLink alone would orphan its children before anyone walked
the tree. The watchdog, started by the launcher in a session of its own, polls its parent and
records its process tree; once the parent is gone it kills (SIGTERM, SIGKILL after a grace)
every recorded process, every process in a session Flower started for the run, and every
process that inherited the run's FLWR_HOME (a scratch directory no other process names), until
none is left. Run as a script (``python watchdog.py <launcher pid> <flwr home>``): it needs
only psutil.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

import psutil

POLL = 1.0  # seconds between looks at the parent (and its process tree)
GRACE = 2.0  # seconds from SIGTERM to SIGKILL
GIVE_UP = 60.0  # seconds of killing after which what is left stays


class Run:
    """What belongs to the run: processes started with its FLWR_HOME; the launcher's
    descendants and the sessions Flower started for them, recorded while it lived (Ray's
    agents rewrite their command line over their environment, and outlive the raylet)."""

    def __init__(self, launcher: int, flwr_home: str):
        self.launcher, self.flwr_home = launcher, flwr_home
        self.mine = {os.getsid(0), os.getsid(launcher)}  # the user's session is not the run's
        self.seen: dict[int, psutil.Process] = {}
        self.sessions: set[int] = set()

    def record(self) -> None:
        try:
            tree = psutil.Process(self.launcher).children(recursive=True)
        except psutil.Error:
            return
        for proc in tree:
            if proc.pid == os.getpid() or proc.pid in self.seen:
                continue
            try:
                sid = os.getsid(proc.pid)
            except OSError:
                continue
            self.seen[proc.pid] = proc
            if sid not in self.mine:
                self.sessions.add(sid)

    def processes(self) -> list[psutil.Process]:
        """The run's processes still running (but this one)."""
        found = [p for p in self.seen.values() if p.is_running()]
        for proc in psutil.process_iter():
            if proc.pid == os.getpid() or proc.pid in self.seen:
                continue
            try:
                if (os.getsid(proc.pid) in self.sessions
                        or proc.environ().get("FLWR_HOME") == self.flwr_home):
                    found.append(proc)
            except (psutil.Error, OSError):  # gone, or another user's
                pass
        return found

    def end(self) -> None:
        """SIGTERM every process of the run, SIGKILL what is left after GRACE; again until a
        look finds none (Ray may start a worker while the others die)."""
        deadline = time.monotonic() + GIVE_UP
        while (procs := self.processes()) and time.monotonic() < deadline:
            terminate(procs, GRACE)


def terminate(procs: list[psutil.Process], grace: float) -> None:
    """SIGTERM ``procs``, SIGKILL what is left after ``grace`` seconds, and wait as long again
    (one that is gone already, or not ours, is skipped). `driftfl run`'s stop uses it too."""
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)


def main(parent: int, flwr_home: str) -> None:
    run = Run(parent, flwr_home)
    while os.getppid() == parent:  # reparented once the launcher is gone
        run.record()
        time.sleep(POLL)
    run.end()
    shutil.rmtree(flwr_home, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
