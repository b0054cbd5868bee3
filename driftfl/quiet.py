"""What a driftfl user reads: the run's own lines. Flower's and Ray's start-up notices, tips
and warnings about settings driftfl chose on purpose reach the console through `flwr run
--stream`; ``driftfl run`` leaves them out unless ``verbose=true``, and shows a simulated
client's lines as the client printed them, without the prefix Ray puts before a worker's
output ("(ClientAppActor pid=4242) "). A Ray process that crashes (a signal, an abseil "Mutex
corrupt", a failed check) dumps its stack there, some 30 lines forwarded under its name:
``Crashes`` makes that one driftfl line. Flower's tracebacks of a simulation that raised
(``Failures``) and of a simulated client that raised (``ClientFailures``) become one line each,
with what was raised."""

from __future__ import annotations

import os
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
    # Flower's closing notice for a failed ServerApp (700: in a simulation): driftfl's error
    # line said why
    r"Exit Code: [27]00$",
    r"^An unhandled exception occurred (in the ServerApp|when running the simulation)\.",
    r"^For more information, visit: <https://flower\.ai/",
    r"FutureWarning",
    r"^\s+warnings\.warn\(",  # the source line Python prints under a warning
]))


# Flower's report of an exception that ended the simulation or the ServerApp
RAISED = re.compile(r"^\w+\s*:\s+(Simulation|ServerApp) raised an exception")
TRACEBACK_TALK = re.compile(r"^(During handling of the above exception|The above exception was)")
EXCEPTION = re.compile(r"^[\w.]+(Error|Exception|Exit|Interrupt|Timeout)\b")
RAY_START = re.compile(r"ray|gcs|raylet|timed? ?out", re.IGNORECASE)
STARTED_RUN = re.compile(r"^Successfully started run (\d+)")
# Ray's prefix before a line a worker printed: the actor or task, its pid, another host's ip
WORKER_PREFIX = re.compile(r"^(?:\x1b\[[0-9;]*m)?\((?:[\w.]+ )?pid=\d+(?:, ip=[\w.:-]+)?\)"
                           r"(?:\x1b\[[0-9;]*m)? ")


# Ray's log prefixes: the process a line was forwarded from, and its C++ logger's stamp
SOURCE = re.compile(r"^\(((?:\w+ )?pid=\d+(?:, ip=[\d.]+)?|\w+)\) ?")
STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+ \w \d+ \d+\] \S+:\d+: ")
CRASH = re.compile(r"^\*\*\* (SIG\w+) received at time|^Fatal Python error: |Mutex corrupt|"
                   r"Check failed: |\bRAW: |^terminate called")
DUMP = re.compile(r"^$|^PC: @ |^\s*@ |^Stack \(most recent call first\)|^Extension modules: |"
                  r"^\s+File \".*\", line \d+ in |^(Current thread|Thread) 0x")
# abseil's notice that a lock was held long (a loaded machine): no crash, the run goes on
SLOW_LOCK = re.compile(r"\bRAW: Lock blocking ")
# the raylet's notice of a dead worker: the round's rejections name it, with what to change
DEAD_WORKER = "A worker died or was killed while executing a task by an unexpected system error"


class Crashes:
    """One line for each Ray process that crashes; the rest of its report left out."""

    def __init__(self) -> None:
        self.crashed: set[str] = set()  # the processes (by Ray's prefix) reported

    def line(self, line: str) -> str | None:
        """What to print for ``line``: itself (None: not a crash report's), "" (left out), or
        the driftfl line that names the crash."""
        text = ANSI.sub("", line).rstrip("\n")
        source = SOURCE.match(text)
        who = source.group(1) if source else ""
        text = STAMP.sub("", text[source.end():] if source else text)
        if text.startswith(DEAD_WORKER) or SLOW_LOCK.search(text):
            return ""
        if who in self.crashed and (CRASH.search(text) or DUMP.search(text)):
            return ""
        if not (found := CRASH.search(text)):
            return None
        self.crashed.add(who)
        what = found.group(1) or text.strip()[:120]
        return (f"driftfl: a Ray process crashed ({who + ': ' if who else ''}{what}); "
                "verbose=true shows its report\n")


def is_noise(line: str) -> bool:
    """Whether ``line`` is one of Flower's or Ray's lines that say nothing about the run."""
    return bool(NOISE.search(ANSI.sub("", line)))


def relay(lines: Iterable[str], verbose: bool, out=None, last: str | None = None,
          seen: dict | None = None) -> bool:
    """Print ``lines`` as they come, Flower's and Ray's noise left out unless ``verbose``;
    return True after the first line that starts with ``last``, when given (False: the lines
    ended without it)."""
    out = out or sys.stdout
    crashes, folds, left_out = Crashes(), (Failures(), ClientFailures()), False
    live = LiveLine(out)
    for line in lines:
        if seen is not None and (started := STARTED_RUN.search(ANSI.sub("", line))):
            seen["run_id"] = started.group(1)  # what `flwr stop` needs, should the user stop
        if not verbose and fold_into(folds, line, live):
            continue  # inside a Flower traceback: at most its one line
        shown = line if verbose else crashes.line(line)
        # (a blank line after one left out belongs to it)
        if shown is None and not is_noise(line) and not (left_out and not line.strip()):
            shown = WORKER_PREFIX.sub("", line)
        if shown:
            live.write(shown)
        left_out = not shown
        if last and ANSI.sub("", line).startswith(last):
            return True
    for fold in folds:
        if pending := fold.close():
            live.write(pending)
    return False


def fold_into(folds, line: str, live) -> bool:
    """Whether one of the ``folds`` (Failures, ClientFailures) took ``line`` into its report;
    a report that ``line`` ends is written as its one line first."""
    for fold in folds:
        folded = fold.line(line)
        if folded is not None:
            if folded:
                live.write(folded)
            return True
        if pending := fold.close():
            live.write(pending)
    return False


def in_traceback(text: str) -> bool:
    """Whether ``text`` continues a Python traceback (its frames, its chained causes)."""
    return (not text.strip() or text.startswith((" ", "\t", "Traceback"))
            or bool(TRACEBACK_TALK.match(text) or EXCEPTION.match(text)))


class Failures:
    """Flower's report of a simulation or ServerApp that raised (about 110 lines when Ray could
    not start on a loaded machine) as one line: what was raised, with advice where it helps;
    verbose=true shows the traceback."""

    def __init__(self) -> None:
        self.block: list[str] | None = None  # the traceback's lines so far

    def line(self, line: str) -> str | None:
        """None: not part of a report (print it as usual); "": taken into the report."""
        text = ANSI.sub("", line).rstrip("\n")
        if RAISED.search(text):
            self.block = []
            return ""
        if self.block is None:
            return None
        if in_traceback(text):
            self.block.append(text)
            return ""
        return None  # the report ended; the caller closes it

    def close(self) -> str:
        """The one line for the report that ended ("" when none was open)."""
        if self.block is None:
            return ""
        raised = [t for t in self.block if EXCEPTION.match(t)]
        self.block = None
        cause = raised[-1].strip() if raised else "Flower named no exception"
        advice = ("; the machine may be too busy for Ray to start: try again, or with fewer "
                  "runs at once" if RAY_START.search(cause) else "")
        return f"driftfl: the simulation failed: {cause[:300]}{advice} (verbose=true shows " \
               "Flower's traceback)\n"


# Flower's report of an exception a simulated client raised: the Ray actor's traceback, then
# the simulation engine's, some 110 lines for one error reply whose reason the server logs too
CLIENT_RAISED = re.compile(r"^ERROR\s*:\s+(ray::ClientAppActor\.run\(\)|Traceback \(most recent)")
CLIENT_REASON = re.compile(r"^Exception ClientAppException occurred\. Message: (.*)")
CLIENT_REPORT = re.compile(r"^(ray::ClientAppActor\.run\(\)|Exception ClientAppException )")


class ClientFailures:
    """Flower's report of an exception a simulated client raised (a node refusing a message,
    a ClientApp that failed) as one line with its reason; verbose=true shows the traceback."""

    def __init__(self) -> None:
        self.reason: str | None = None  # None: no report open
        self.last = ""  # the last exception line, should Flower name no reason

    def line(self, line: str) -> str | None:
        """None: not part of a report (print it as usual); "": taken into the report."""
        text = ANSI.sub("", line).rstrip("\n")
        if CLIENT_RAISED.match(text):
            self.reason = self.reason or ""
            return ""
        if self.reason is None:
            return None
        if found := CLIENT_REASON.match(text):
            self.reason = found.group(1).strip()
            return ""
        if in_traceback(text) or CLIENT_REPORT.match(text):
            self.last = text.strip() if EXCEPTION.match(text) else self.last
            return ""
        return None

    def close(self) -> str:
        """The one line for the report that ended ("" when none was open)."""
        if self.reason is None:
            return ""
        reason = self.reason or self.last or "Flower named no reason"
        self.reason, self.last = None, ""
        return (f"driftfl: a simulated client failed: {reason[:300]} (verbose=true shows "
                "Flower's traceback)\n")


# a progress line (driftfl.server.progress): "<step>: <done>/<total> <unit> (<seconds> s)"
PROGRESS_LINE = re.compile(r"(.+?): \d+/\d+ .* \((\d+) s\)\s*$")
LOG_EVERY = 30.0  # seconds of a step between its progress lines in a log

# where a line goes when stderr's reader is gone: the terminal the user typed the command in
TERMINAL = "/dev/tty"


# the file descriptors whose reader has gone (drop)
_dropped: set[int] = set()


def drop(stream) -> None:
    """``stream`` (stdout or stderr) writes to /dev/null from now on: its reader is gone
    (Ctrl-C on `driftfl run ... 2>&1 | tee run.log` stops tee too), and a write, or the
    interpreter's last flush, would otherwise end the command with a traceback and exit code 1
    or 120 instead of the stop's."""
    descriptor = _descriptor(stream)
    if descriptor is None:  # not a file (a test's capture): no pipe to lose
        return
    nowhere = os.open(os.devnull, os.O_WRONLY)
    os.dup2(nowhere, descriptor)
    os.close(nowhere)
    _dropped.add(descriptor)


def _descriptor(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation
        return None


def say(line: str) -> None:
    """``line`` on stderr, or, where stderr's reader is gone, on the terminal (when there is
    one): a stop's line that says how to go on must reach the user."""
    if _descriptor(sys.stderr) not in _dropped:
        try:
            print(line, file=sys.stderr, flush=True)
            return
        except BrokenPipeError:
            drop(sys.stderr)
    try:
        with open(TERMINAL, "w") as terminal:
            terminal.write(line + "\n")
    except OSError:  # no terminal (a job without one): the run directory still says it
        pass


class LiveLine:
    """Writes a run's lines to ``out``; on a terminal, the ServerApp's progress lines
    (driftfl.server.progress) as one line rewritten in place, cleared by the next line."""

    def __init__(self, out):
        from driftfl.server.progress import PROGRESS

        self.out, self.progress = out, PROGRESS
        self.tty = hasattr(out, "isatty") and out.isatty()
        self.pending = False  # a progress line is on the screen, without its newline
        self.step_shown: tuple[str, float] | None = None  # a log's last progress: step, seconds

    def _thinned(self, line: str) -> bool:
        """Whether a log (not a terminal) leaves out this progress line: it shows a step's
        first, then one per LOG_EVERY seconds of the step (a 10-client round would otherwise
        write a line per client)."""
        found = PROGRESS_LINE.match(line[len(self.progress):])
        if not found:
            return False
        step, seconds = found.group(1), float(found.group(2))
        if self.step_shown and self.step_shown[0] == step and (
                seconds - self.step_shown[1] < LOG_EVERY):
            return True
        self.step_shown = (step, seconds)
        return False

    def write(self, line: str) -> None:
        try:
            self._write(line)
        except BrokenPipeError:  # the reader is gone; the run goes on, its directory says all
            drop(self.out)

    def _write(self, line: str) -> None:
        progress = ANSI.sub("", line).startswith(self.progress)
        if progress and not self.tty and self._thinned(ANSI.sub("", line)):
            return
        if self.pending:
            self.out.write("\r\x1b[K")
        if progress and self.tty:
            self.out.write(ANSI.sub("", line).rstrip("\n")[len("driftfl: "):])
        else:
            self.out.write(line)
        self.pending = progress and self.tty
        self.out.flush()
