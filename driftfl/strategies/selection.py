"""Which nodes train in a round: the ``selection`` part of a strategy.

The strategy decides how many (Flower's ``fraction_train`` and ``min_train_nodes``); a selection
decides which, from the connected nodes in partition order, so that the seed fixes the choice
whatever node ids Flower assigned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from pydantic import Field
from torch import nn

from driftfl.common.config import ExperimentConfig
from driftfl.common.settings import NoSettings, Settings

from .cka import select_clients

EXPLORED_CLIENTS = "explored-clients"  # what CKA selection needs its strategy to provide


@dataclass(frozen=True)
class ExploredClients:
    """What a strategy knows of the clients it has explored (DCFL): the nodes, in the order
    they were explored, and the CKA matrix between their classifiers, in that order."""

    nodes: list[int]
    matrix: np.ndarray


class Selection:
    """Seeded uniform sampling without replacement: the same seed and round, the same nodes.
    Every other rule refines it (DCFL's CKA-guided exploit/explore, ...)."""

    Settings: ClassVar[type[Settings]] = NoSettings  # the ``selection`` section's settings
    needs: ClassVar[frozenset[str]] = frozenset()  # what the strategy must provide

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed
        self.last_exploited: list[int] = []  # nodes chosen by what is known of them

    @classmethod
    def from_config(cls, cfg: ExperimentConfig, model: nn.Module) -> Selection:
        return cls(seed=cfg.seed)

    def rng(self, server_round: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, server_round])

    def select(self, server_round: int, nodes: list[int], count: int,
               explored: ExploredClients | None = None) -> list[int]:
        """``count`` of ``nodes`` (given in partition order), returned in that order."""
        chosen = sorted(self.rng(server_round).choice(len(nodes), size=count, replace=False))
        return [nodes[i] for i in chosen]


class CKASettings(Settings):
    epsilon: float = Field(0.5, ge=0, le=1)  # share of the round's clients exploited


class CKASelection(Selection):
    """DCFL's selection: floor(epsilon * count) explored clients, drawn with probability
    proportional to the sum of their CKA similarity to the other explored clients (clients
    alike the rest: the paper's Eq. 4); the rest explored anew at random among the unexplored
    (filled from the explored when none are left)."""

    Settings = CKASettings
    needs = frozenset({EXPLORED_CLIENTS})

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
