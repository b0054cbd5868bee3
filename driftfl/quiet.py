"""What a driftfl user reads: the run's own lines. Flower's and Ray's start-up notices, tips
and warnings about settings driftfl chose on purpose reach the console through `flwr run
--stream`; ``driftfl run`` leaves them out unless ``verbose=true``, and shows a simulated
client's lines as the client printed them, without the prefix Ray puts before a worker's
output ("(ClientAppActor pid=4242) ")."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable

ANSI = re.compile(r"\x1b\[[0-9;]*m")
NOISE = re.compile("|".join([
    r"^Using SuperLink: ",  # flwr run: which connection
    r"^Successfully started run \d+",
    r"Starting logstream for run_id",
    r"Exiting logstream",  # Ctrl-C: driftfl says what stopped
    r"Starting Flower Simulation",
    r"default simulated SuperNodes changed",  # driftfl sizes the federation itself
    r"^\w+\s*:\s+Federation `",
    r"To change federation size",
    r"flwr federation simulation-config",
    r"^Successfully installed \S+ to ",  # the app bundle, unpacked per run
    r"Manually terminating ClientAppActor",  # Flower's normal shutdown of its actors
    r"Ray deduplicates logs by default",
    # Flower's closing notice for a failed ServerApp: driftfl's error line said why
    r"Exit Code: 200$",
    r"^An unhandled exception occurred in the ServerApp\.",
    r"^For more information, visit: <https://flower\.ai/",
    r"FutureWarning",
    r"^\s+warnings\.warn\(",  # the source line Python prints under a warning
]))


# Ray's prefix before a line a worker printed: the actor or task, its pid, another host's ip
WORKER_PREFIX = re.compile(r"^(?:\x1b\[[0-9;]*m)?\((?:[\w.]+ )?pid=\d+(?:, ip=[\w.:-]+)?\)"
                           r"(?:\x1b\[[0-9;]*m)? ")


def is_noise(line: str) -> bool:
    """Whether ``line`` is one of Flower's or Ray's lines that say nothing about the run."""
    return bool(NOISE.search(ANSI.sub("", line)))


def relay(lines: Iterable[str], verbose: bool, out=None, last: str | None = None) -> bool:
    """Print ``lines`` as they come, Flower's and Ray's noise left out unless ``verbose``;
    return True after the first line that starts with ``last``, when given (False: the lines
    ended without it)."""
    out = out or sys.stdout
    for line in lines:
        if verbose or not is_noise(line):
            out.write(line if verbose else WORKER_PREFIX.sub("", line))
            out.flush()
        if last and ANSI.sub("", line).startswith(last):
            return True
    return False
