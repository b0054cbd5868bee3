"""What each selected client is asked to do in a round beyond the experiment's settings, and
the checks that follow from it: heterogeneity= (its local epochs, a straggler's step budget,
who drops out; driftfl.common.conditions) and per-client evaluation (who measures its
held-out split, every eval_every rounds).

Every draw comes from the experiment seed, the round and the client's partition id, so a
stateless server (a resumed run) draws the same. The server keeps what it asked of each node:
a reply's ``local-steps`` is checked against exactly that (``training``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
from flwr.app import ConfigRecord

from driftfl.common.client_split import ACC_AFTER, ACC_BEFORE
from driftfl.common.conditions import (ASSIGNED_EPOCHS, ASSIGNED_MAX_STEPS, ASSIGNMENT,
                                       EVALUATE_CLIENT, HeterogeneitySettings, assignments)
from driftfl.common.training import TrainSettings

from driftfl.strategies.parts.aggregation import ClientUpdate

EVAL_PURPOSE = 13  # the SeedSequence key's last entry: which clients evaluate


class RoundPlan:
    """``heterogeneity``: the conditions; ``client_eval``: per-client evaluation is on
    (client_test_fraction > 0); ``eval_every``, ``eval_clients`` (0: all), ``rounds``: when and
    by how many it is measured (every eval_every rounds and the last)."""

    def __init__(self, heterogeneity: HeterogeneitySettings | None = None, *, seed: int = 0,
                 local_epochs: int = 1, client_eval: bool = False, eval_every: int = 1,
                 eval_clients: int = 0, rounds: int = 0) -> None:
        self.heterogeneity = heterogeneity or HeterogeneitySettings()
        self.seed, self.local_epochs = seed, local_epochs
        self.client_eval, self.eval_every = client_eval, eval_every
        self.eval_clients, self.rounds = eval_clients, rounds
        self.assigned: dict[int, TrainSettings] = {}  # node -> what it was asked to train
        self.records: dict[int, dict] = {}  # node -> its assignment record's entries
        self.dropped: list[int] = []  # nodes selected but dropped this round
        self.evaluated: set[int] = set()  # nodes asked for per-client evaluation

    @classmethod
    def from_config(cls, cfg) -> RoundPlan:
        return cls(cfg.heterogeneity, seed=cfg.seed, local_epochs=cfg.local_epochs,
                   client_eval=cfg.client_test_fraction > 0, eval_every=cfg.eval_every,
                   eval_clients=cfg.eval_clients, rounds=cfg.rounds)

    def start(self, server_round: int, nodes: list[int], key_of: Callable[[int], int],
              examples_of: Callable[[int], float], local: TrainSettings | None) -> list[int]:
        """This round's nodes that go on (the dropped ones left out), each one's assignment
        kept; ``key_of``: a node's partition id, ``examples_of``: the examples it trains on."""
        self.assigned, self.records, self.evaluated = {}, {}, set()
        drawn = assignments(self.heterogeneity, self.seed, server_round,
                            [key_of(n) for n in nodes], self.local_epochs)
        self.dropped = [n for n in nodes if drawn[key_of(n)].dropped]
        kept = [n for n in nodes if n not in self.dropped]
        self.evaluated = self._evaluating(server_round, kept, key_of)
        for node in kept:
            record = {EVALUATE_CLIENT: 1} if node in self.evaluated else {}
            if self.heterogeneity.enabled and local is not None:
                asked = self._asked(drawn[key_of(node)], local, examples_of(node))
                self.assigned[node] = asked
                record.update({ASSIGNED_EPOCHS: asked.epochs,
                               ASSIGNED_MAX_STEPS: asked.max_steps or 0})
            if record:
                self.records[node] = record
        return kept

    @staticmethod
    def _asked(assignment, local: TrainSettings, examples: float) -> TrainSettings:
        asked = replace(local, epochs=assignment.epochs)
        if assignment.budget is not None and np.isfinite(examples):
            asked = replace(asked, max_steps=assignment.max_steps(asked.steps(examples)))
        return asked

    def _evaluating(self, server_round: int, nodes: list[int], key_of) -> set[int]:
        if not self.client_eval or not (server_round % self.eval_every == 0
                                        or server_round == self.rounds):
            return set()
        if not self.eval_clients or self.eval_clients >= len(nodes):
            return set(nodes)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, server_round, 0,
                                                            EVAL_PURPOSE]))
        order = sorted(nodes, key=key_of)
        return {order[i] for i in rng.permutation(len(order))[:self.eval_clients]}

    def record(self, node: int) -> dict:
        """The named record a node's train message carries (none when nothing is asked)."""
        own = self.records.get(node)
        return {ASSIGNMENT: ConfigRecord(dict(own))} if own else {}

    def training(self, node: int, local: TrainSettings | None) -> TrainSettings | None:
        """What the node was asked to train this round (the experiment's local stage when
        nothing else was asked)."""
        return self.assigned.get(node, local)

    def reject(self, update: ClientUpdate) -> str | None:
        """An accuracy the node was asked for must be there and in [0, 1]; none otherwise."""
        asked = update.node_id in self.evaluated
        for key in (ACC_BEFORE, ACC_AFTER):
            value = update.metrics.get(key)
            if not asked and value is not None:
                return f"'{key}' was not asked for this round"
            if asked and not (isinstance(value, float) and 0.0 <= value <= 1.0):
                return f"'{key}' is {value}; per-client evaluation asks for an accuracy in [0, 1]"
        return None
