"""Progress within a round: how many of the asked clients have answered, how far the server's
evaluation has come. A round of a CNN on 2 cores takes minutes, and a run that prints nothing for
minutes cannot be told from one that hangs.

In simulation the grid's own wait (server/simulated.py) and in deployment ``GatheringGrid`` look
for the replies and count them. The ServerApp prints plain lines that start with ``PROGRESS``;
`driftfl run` shows them as one line rewritten in place on a terminal and as they are elsewhere
(a log, CI), see driftfl.quiet.
A step that ends within ``FIRST`` seconds prints nothing; after that a line comes when the count
moves (at most every ``EVERY`` seconds) or, while it does not, every ``QUIET`` seconds: quick
rounds stay as quiet as before, and a log gets a few lines a minute at most.
"""

from __future__ import annotations

import time

PROGRESS = "driftfl: progress "
FIRST = 5.0  # seconds a step runs before its first line
EVERY = 5.0  # seconds between lines
QUIET = 30.0  # seconds between lines while the count stands still


class Progress:
    """One step's progress (``what``: e.g. "round 3: train"), counted in ``unit``."""

    def __init__(self, what: str, unit: str, first: float = FIRST, every: float = EVERY):
        self.what, self.unit, self.first, self.every = what, unit, first, every
        self.started = time.monotonic()
        self.shown: tuple[int, int] | None = None
        self.last = -float("inf")

    def update(self, done: int, total: int) -> None:
        now = time.monotonic()
        wait = QUIET if (done, total) == self.shown else self.every
        if now - self.last < wait or done >= total or now - self.started < self.first:
            return
        self.shown, self.last = (done, total), now
        print(f"{PROGRESS}{self.what}: {done}/{total} {self.unit} "
              f"({now - self.started:.0f} s)", flush=True)


def gather(grid, awaited: set[str], timeout: float | None, pause, what: str) -> list:
    """The replies to the messages ``awaited`` (their ids) that ``grid`` returns within
    ``timeout`` seconds (None: all of them), looking again after ``pause(n awaited)`` seconds,
    with a progress line of the clients that answered (``what``: the step)."""
    deadline = float("inf") if timeout is None else time.monotonic() + timeout
    total, replies = len(awaited), []
    progress = Progress(what, "clients answered")
    while awaited and time.monotonic() < deadline:
        arrived = list(grid.pull_messages(awaited))
        replies += arrived
        awaited -= {reply.metadata.reply_to_message_id for reply in arrived}
        if awaited:
            progress.update(total - len(awaited), total)
            time.sleep(pause(len(awaited)))
    return replies


def step_of(messages: list) -> str:
    """What a round's messages ask, for its progress line: "round 3: train"."""
    if not messages:
        return ""
    from driftfl.common.protocol import SERVER_ROUND

    first = messages[0]
    kind = first.metadata.message_type.split(".")[0]
    rounds = [record[SERVER_ROUND] for record in first.content.config_records.values()
              if SERVER_ROUND in record]
    return f"round {rounds[0]}: {kind}" if rounds else kind


DEPLOYED_PULL_SECONDS = 3.0  # Flower's own pause between looks for a deployed grid's replies


class GatheringGrid:
    """Flower's deployed grid whose wait for replies is ``gather``'s: a look every 3 s, as
    Flower's own, with the round's progress line."""

    def __init__(self, grid):
        self._grid = grid

    def __getattr__(self, name):
        return getattr(self._grid, name)

    def send_and_receive(self, messages, *, timeout: float | None = None) -> list:
        messages = list(messages)
        return gather(self._grid, set(self._grid.push_messages(messages)), timeout,
                      lambda awaited: DEPLOYED_PULL_SECONDS, step_of(messages))
