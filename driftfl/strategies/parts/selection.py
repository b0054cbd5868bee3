"""Which nodes train in a round: the ``selection`` part of a strategy.

The strategy decides how many (Flower's ``fraction_train`` and ``min_train_nodes``); a selection
decides which, from the connected nodes in partition order, so that the seed fixes the choice
whatever node ids Flower assigned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from torch import nn

from driftfl.common import settings
from driftfl.common.config import ExperimentConfig
from driftfl.specs import PartSpec
from driftfl.specs import parts as declared


@dataclass(frozen=True)
class ExploredClients:
    """What a strategy knows of the clients it has explored (DCFL): the nodes, in the order
    they were explored, and the CKA matrix between their classifiers, in that order."""

    nodes: list[int]
    matrix: np.ndarray


class Selection:
    """Seeded uniform sampling without replacement: the same seed and round, the same nodes.
    Every other rule refines it (DCFL's CKA-guided exploit/explore, ...)."""

    # what the rule declares (driftfl.specs.parts, checked before torch loads): the
    # ``selection`` section's settings and what the strategy must provide
    spec: ClassVar[PartSpec] = declared.SELECTIONS["uniform"]
    Settings: ClassVar[type[settings.Settings]] = settings.NoSettings
    needs: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "spec" in cls.__dict__:
            cls.Settings, cls.needs = cls.spec.Settings, cls.spec.needs

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
