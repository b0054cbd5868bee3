"""Which nodes train in a round: the ``selection`` part of a strategy.

The strategy decides how many (Flower's ``fraction_train`` and ``min_train_nodes``); a selection
decides which, from the connected nodes in partition order, so that the seed fixes the choice
whatever node ids Flower assigned.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from torch import nn

from driftfl.common.config import ExperimentConfig
from driftfl.common.settings import NoSettings, Settings


class Selection:
    """Seeded uniform sampling without replacement: the same seed and round, the same nodes.
    Every other rule refines it (DCFL's CKA-guided exploit/explore, ...)."""

    Settings: ClassVar[type[Settings]] = NoSettings  # the ``selection`` section's settings

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed

    @classmethod
    def from_config(cls, cfg: ExperimentConfig, model: nn.Module) -> Selection:
        return cls(seed=cfg.seed)

    def select(self, server_round: int, nodes: list[int], count: int) -> list[int]:
        """``count`` of ``nodes`` (given in partition order), returned in that order."""
        rng = np.random.default_rng([self.seed, server_round])
        chosen = sorted(rng.choice(len(nodes), size=count, replace=False))
        return [nodes[i] for i in chosen]
