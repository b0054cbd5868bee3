"""The command blocks of README.md and the pages it sends a new user to (docs/running.md,
docs/deployment.md), read from the pages themselves, and a way to run them as a new user would:
from a fresh HOME, in a fresh copy of the repository, one command after another.

What the walk changes, and nothing else (the README's own settings, so a user could type the
same):
- ``rounds=<n>`` becomes fewer rounds (a ``driftfl run`` without it, whose experiment sets its
  own, gets ``rounds=``), and every experiment gets ``dataset.subset`` and
  ``dataset.test_subset`` (in ``driftfl run``/``split`` overrides and in ``flwr run``'s
  ``overrides='...'``);
- the example host names (``fl.example.org``, ``203.0.113.7``) become 127.0.0.1, the machine the
  test runs on;
- a sweep (``driftfl run -m``) runs 3 jobs at a time with Hydra's joblib launcher
  (``hydra/launcher=joblib``, which driftfl installs): the same jobs and directories, sooner.
Servers (a SuperLink, a SuperNode, the fleet proxy) are started in the background, as a user
starts them in another terminal, and stopped when the walk ends.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from driftfl.host import stop

FENCE = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^(#{1,4}) (.+)$", re.MULTILINE)
HOSTS = {"fl.example.org": "127.0.0.1", "203.0.113.7": "127.0.0.1"}
SERVERS = ("flower-superlink", "flower-supernode")
SUBSET = "dataset.subset=2000 dataset.test_subset=500"
PARALLEL_SWEEP = "hydra/launcher=joblib hydra.launcher.n_jobs=3"


def headings(text: str) -> list[re.Match]:
    """The page's headings, not a code block's comment lines that look like one."""
    fences = [m.span() for m in FENCE.finditer(text)]
    return [m for m in HEADING.finditer(text)
            if not any(start <= m.start() < end for start, end in fences)]


def sections(readme: str) -> dict[str, list[str]]:
    """Each heading's bash blocks (the text under it up to the next heading)."""
    found: dict[str, list[str]] = {}
    marks = headings(readme) + [None]
    for mark, after in zip(marks, marks[1:]):
        text = readme[mark.end():after.start() if after else len(readme)]
        found[mark.group(2).strip()] = [m.group(1) for m in FENCE.finditer(text)]
    return found


def paragraph_blocks(readme: str, heading: str, starts: str) -> list[str]:
    """The bash blocks under ``heading`` whose paragraph begins with ``starts`` (a section's
    blocks that follow a sentence such as "**On one machine**")."""
    text = readme[readme.index(f"{heading}\n"):]
    following = [m for m in headings(text) if m.start() > 0]
    text = text[:following[0].start() if following else len(text)]
    text = text[text.index(starts):]
    return [m.group(1) for m in FENCE.finditer(text)]


def commands(block: str) -> list[str]:
    """A block's commands: continuation lines joined, a here-document kept with its command,
    comments dropped."""
    found, lines = [], iter(block.splitlines())
    for line in lines:
        line = re.sub(r"\s+#\s.*$", "", line).rstrip()
        if not line or line.startswith("#"):
            continue
        while line.endswith("\\"):
            line = line[:-1].rstrip() + " " + next(lines).strip()
        heredoc = re.search(r"<<\s*'?(\w+)'?", line)
        if heredoc:
            body = []
            for more in lines:
                body.append(more)
                if more.strip() == heredoc.group(1):
                    break
            line = "\n".join([line, *body])
        found.append(line)
    return found


def smaller(command: str, rounds: int) -> str:
    """The command with fewer rounds and a data subset (see the module's note)."""
    for name, address in HOSTS.items():
        command = command.replace(name, address)
    command = re.sub(r"\brounds=\d+", f"rounds={rounds}", command)
    command = command.replace("overrides='", f"overrides='{SUBSET} ")
    if re.match(r"(\S*/)?driftfl (run|split) ", command) and "--cfg" not in command:
        command += f" {SUBSET}"
        if command.split()[1] == "run" and "rounds=" not in command:  # an experiment's own
            command += f" rounds={rounds}"
        if command.split()[1:3] == ["run", "-m"]:
            command += f" {PARALLEL_SWEEP}"
    return command


@dataclass
class Walk:
    """A fresh HOME and a copy of the repository to run README commands in; servers started
    along the way are stopped by ``close``."""

    repo: Path
    root: Path
    rounds: int = 1
    host: str | None = None  # a simulation host's FLWR_HOME that the runs submit to
    servers: list[subprocess.Popen] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.home, self.cwd = self.root / "home", self.root / "driftfl"
        self.home.mkdir(parents=True)
        self.cwd.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(self.repo / name, self.cwd / name)
        for name in ("driftfl", "conf", "scripts"):
            shutil.copytree(self.repo / name, self.cwd / name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        (self.cwd / ".venv").symlink_to(self.repo / ".venv")
        venv_bin = str(self.repo / ".venv" / "bin")
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("FLWR_HOME", "RAY_ADDRESS", "VIRTUAL_ENV")}
        self.env.update(HOME=str(self.home), PATH=f"{venv_bin}:{os.environ['PATH']}",
                        VIRTUAL_ENV=str(self.repo / ".venv"))
        if self.host:
            from driftfl.host import HOST_ENV

            self.env[HOST_ENV] = self.host

    def run(self, command: str, cwd: Path | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess:
        """One README command, made smaller, in ``cwd`` (the repository's copy by default); a
        server is started and waited for instead."""
        command, cwd = smaller(command, self.rounds), cwd or self.cwd
        self.log.append(f"$ {command}")
        if command.split()[0] in SERVERS or (" secure proxy " in f" {command} "
                                               and "--print-config" not in command):
            return self._serve(command, cwd)
        out = subprocess.run(["bash", "-c", command], cwd=cwd, env=self.env,
                             capture_output=True, text=True, timeout=timeout)
        self.log.append(out.stdout[-4000:] + out.stderr[-4000:])
        assert out.returncode == 0, "\n".join(self.log[-30:])
        return out

    def block(self, block: str, cwd: Path | None = None) -> list[subprocess.CompletedProcess]:
        return [self.run(c, cwd) for c in commands(block)]

    def _serve(self, command: str, cwd: Path) -> subprocess.CompletedProcess:
        number = len(self.servers)
        log = self.root / f"server-{number}.log"
        with open(log, "w") as sink:
            server = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd,
                                      env=self.env, stdout=sink, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        self.servers.append(server)
        port = re.search(r"--(?:port|listen) (?:\S+:)?(\d+)", command)
        if not command.startswith("flower-supernode") and port:
            self._wait_for_port(int(port.group(1)), server, log)
        return subprocess.CompletedProcess(command, 0, "", "")

    def _wait_for_port(self, port: int, server: subprocess.Popen, log: Path) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert server.poll() is None, f"{server.args} exited: {log.read_text()[-3000:]}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"nothing listens on {port} after 90 s: {log.read_text()[-3000:]}")

    def close(self) -> None:
        for server in reversed(self.servers):
            stop(server)
