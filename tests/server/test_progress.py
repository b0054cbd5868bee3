"""Progress within a round: a line once a step has run FIRST seconds, then when the count moves
(at most every EVERY s) or every QUIET s while it stands; on a terminal one line in place."""

from __future__ import annotations

import io

from driftfl.quiet import relay
from driftfl.server import progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_progress_lines_come_late_and_sparse(monkeypatch, capsys):
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    step = progress.Progress("round 3: train", "clients answered")
    shown = []
    for t, done in [(1, 0), (4, 1), (6, 1), (8, 2), (12, 3), (20, 3), (41, 3), (42, 3), (44, 5)]:
        clock.now = 100.0 + t
        step.update(done, 5)
        shown += capsys.readouterr().out.splitlines()
    assert shown == [  # nothing before 5 s; 8 s: too soon after 6 s; 20 s: nothing moved
        "driftfl: progress round 3: train: 1/5 clients answered (6 s)",
        "driftfl: progress round 3: train: 3/5 clients answered (12 s)",
        "driftfl: progress round 3: train: 3/5 clients answered (42 s)"]  # standing 30 s


class Meta:
    """A message's metadata, as much of it as the wait for replies reads."""

    def __init__(self, i):
        self.reply_to_message_id = i
        self.message_type = "train"


class Reply:
    def __init__(self, i):
        self.metadata = Meta(i)


def test_gather_counts_the_replies_as_they_come(monkeypatch):
    """The simulation's look for replies: every reply returned once, progress on the way."""
    class Grid:
        looks = 0

        def pull_messages(self, awaited):
            self.looks += 1
            return [Reply(min(awaited))] if self.looks % 2 == 0 else []

    monkeypatch.setattr(progress.time, "sleep", lambda s: None)
    grid = Grid()
    replies = progress.gather(grid, {"a", "b", "c"}, None, lambda n: 0.0, "round 1: train")
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["a", "b", "c"]
    assert grid.looks == 6


def test_a_terminal_shows_progress_in_place_and_a_log_as_lines():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    lines = ["a\n", "driftfl: progress round 1: train: 1/5 clients answered (6 s)\n",
             "driftfl: progress round 1: train: 2/5 clients answered (11 s)\n", "round 1/3\n"]
    log, terminal = io.StringIO(), Terminal()
    relay(lines, False, log)
    relay(lines, False, terminal)
    assert log.getvalue() == "".join(lines[:2] + lines[3:])  # a step's lines: see below
    assert terminal.getvalue() == (
        "a\nprogress round 1: train: 1/5 clients answered (6 s)\r\x1b[K"
        "progress round 1: train: 2/5 clients answered (11 s)\r\x1b[Kround 1/3\n")


def test_a_deployed_round_waits_as_flower_does_and_returns_every_reply(monkeypatch):
    """GatheringGrid: push, then a look every 3 s (Flower's pause) until every reply came."""
    slept = []

    class FlowerGrid:
        looks = 0

        def push_messages(self, messages):
            return [f"m{i}" for i, _ in enumerate(messages)]

        def pull_messages(self, awaited):
            self.looks += 1
            return [Reply(min(awaited))] if self.looks > 1 else []

        def get_node_ids(self):
            return [7]

    class Sent:
        def __init__(self):
            self.metadata = Meta("")
            self.content = type("Content", (), {"config_records": {}})()

    monkeypatch.setattr(progress.time, "sleep", slept.append)
    grid = progress.GatheringGrid(FlowerGrid())
    replies = grid.send_and_receive([Sent(), Sent()], timeout=None)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1"]
    assert slept == [3.0, 3.0] and grid.get_node_ids() == [7]  # the rest passes through


def test_a_log_gets_a_steps_first_progress_line_then_one_per_half_minute():
    """A 10-client round answered a client every 7 s: a terminal rewrites one line, a log gets
    the step's first line and then one per 30 s of it, and each new step starts afresh."""
    train = [f"driftfl: progress round 2: train: {n}/10 clients answered ({5 + 7 * n} s)\n"
             for n in range(1, 10)]
    evaluate = ["driftfl: progress round 2: evaluate: 1/2 batches (6 s)\n"]
    log = io.StringIO()
    relay([*train, *evaluate], False, log)
    assert log.getvalue() == "".join([train[0], train[5], evaluate[0]])  # 12 s, 47 s; eval
