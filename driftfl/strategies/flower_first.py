"""How a Flower strategy and DriftStrategy are combined (FedProx, FedAvgM)."""

from __future__ import annotations

import math

from driftfl.common.training import TrainSettings
from driftfl.strategies.parts.aggregation import Aggregation
from driftfl.strategies.parts.selection import Selection


class FlowerFirst:
    """For a Flower strategy placed before DriftStrategy in the bases (so that its
    ``configure_train``/``aggregate_train`` run and call on to DriftStrategy's): Flower's
    constructor passes only its own settings on, so the parts are handed over after it."""

    def __init__(self, *, selection: Selection | None = None,
                 aggregation: Aggregation | None = None, objective: str = "ce",
                 round_timeout: float = 3600.0, max_update_ratio: float = 10.0,
                 max_peer_ratio: float = 30.0, local_training: TrainSettings | None = None,
                 max_examples_ratio: float = math.inf, exclude_after: int = 0,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.assemble(selection, aggregation, objective, round_timeout, max_update_ratio,
                      max_peer_ratio, local_training, max_examples_ratio, exclude_after)
