"""DCFL's client selection, a ``selection`` part: CKA-guided exploit and explore."""

from __future__ import annotations

import numpy as np

from driftfl.dcfl.cka import select_clients
from driftfl.specs import parts as declared
from driftfl.strategies.parts.selection import Selection


class CKASelection(Selection):
    """DCFL's selection: floor(epsilon * count) explored clients, drawn with probability
    proportional to the sum of their CKA similarity to the other explored clients (clients
    alike the rest: the paper's Eq. 4); the rest explored anew at random among the unexplored
    (filled from the explored when none are left)."""

    spec = declared.SELECTIONS["cka"]

    def __init__(self, *, seed: int = 0, epsilon: float) -> None:
        super().__init__(seed=seed)
        self.epsilon = epsilon

    @classmethod
    def from_config(cls, cfg, model) -> CKASelection:
        return cls(seed=cfg.seed, epsilon=cfg.selection.epsilon)

    def select(self, server_round, nodes, count, explored=None):
        if explored is None:
            raise ValueError("CKA selection needs the explored clients (strategy=dcfl)")
        available, position = set(nodes), {n: i for i, n in enumerate(explored.nodes)}
        known = [n for n in explored.nodes if n in available]
        matrix = explored.matrix[np.ix_(*[[position[n] for n in known]] * 2)]
        fresh = [n for n in nodes if n not in position]
        old, new = select_clients(known, fresh, matrix, count, self.epsilon,
                                  self.rng(server_round))
        self.last_exploited = old
        chosen = set(old) | set(new)
        return [n for n in nodes if n in chosen]
