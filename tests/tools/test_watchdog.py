"""The watchdog of `driftfl run` (driftfl/watchdog.py) with real processes: a stand-in launcher
starts it as `driftfl run` does (launch.start_watchdog), then a child in a session of its own
that carries the run's FLWR_HOME (as Flower's flwr-simulation does) and a grandchild below it;
the launcher is then killed with SIGKILL. The e2e test (tests/e2e/test_e2e_orphans.py) does the
same to a whole real run; this one takes seconds."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

from driftfl.watchdog import terminate

LAUNCHER = """
import os, subprocess, sys, time
from driftfl.host import start_watchdog
home = sys.argv[1]
watchdog = start_watchdog(home)
# Flower's processes: a session of their own, the run's FLWR_HOME, a child of their own
child = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"],
    env={**os.environ, "FLWR_HOME": home}, start_new_session=True)
print(watchdog.pid, child.pid, flush=True)
time.sleep(600)
"""


def _wait_until(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return check()


def test_a_killed_launcher_leaves_no_process_of_its_run_and_no_flwr_home(tmp_path):
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "app").write_text("the run's scratch files")
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(home)],
                                stdout=subprocess.PIPE, text=True)
    watchdog_pid, child_pid = map(int, launcher.stdout.readline().split())
    child = psutil.Process(child_pid)
    assert _wait_until(lambda: len(child.children()) == 1, 30)
    run = [child, *child.children(), psutil.Process(watchdog_pid)]
    time.sleep(1.5)  # a poll of the watchdog records the tree
    try:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert _wait_until(lambda: not any(p.is_running() and p.status() != "zombie"
                                           for p in run), 30), [p.pid for p in run
                                                                if p.is_running()]
        assert not home.exists()
    finally:
        terminate([p for p in run if p.is_running()], 1.0)


def test_terminate_kills_what_ignores_sigterm():
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                 "print(1, flush=True); time.sleep(600)"],
                                stdout=subprocess.PIPE, text=True)
    stubborn.stdout.readline()  # SIGTERM is ignored from here on
    proc = psutil.Process(stubborn.pid)
    started = time.monotonic()
    terminate([proc], grace=0.5)
    # psutil reaps its own child, so the exit status is on psutil's handle, not Popen's
    assert proc.returncode == -signal.SIGKILL
    assert not proc.is_running()
    assert time.monotonic() - started < 5
