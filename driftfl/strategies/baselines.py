"""FedAvg, FedProx and FedAvgM: Flower's own strategies on driftfl's parts.

FedProx and FedAvgM inherit from Flower's class *and* from DriftStrategy: Flower's code runs
(FedProx's ``proximal-mu`` in every train message, FedAvgM's server momentum) around
driftfl's sampling, reply checks and aggregation part.
"""

from __future__ import annotations

import math

import numpy as np
from flwr.serverapp import strategy as flwr_strategy
from pydantic import Field

from driftfl.common.protocol import PROXIMAL_MU
from driftfl.common.training import TrainSettings

from .aggregation import Aggregation, to_numpy, to_record
from .base import DriftStrategy, StrategySettings
from .selection import Selection


class FlowerFirst:
    """For a Flower strategy placed before DriftStrategy in the bases (so that its
    ``configure_train``/``aggregate_train`` run and call on to DriftStrategy's): Flower's
    constructor passes only its own settings on, so the parts are handed over after it."""

    def __init__(self, *, selection: Selection | None = None,
                 aggregation: Aggregation | None = None, objective: str = "ce",
                 round_timeout: float = 3600.0, max_update_ratio: float = 10.0,
                 max_peer_ratio: float = 30.0, local_training: TrainSettings | None = None,
                 max_examples_ratio: float = math.inf, **kwargs) -> None:
        super().__init__(**kwargs)
        self.assemble(selection, aggregation, objective, round_timeout, max_update_ratio,
                      max_peer_ratio, local_training, max_examples_ratio)


class FedAvg(DriftStrategy):
    """The weighted average of the client models (with the default parts)."""


class FedProx(FlowerFirst, flwr_strategy.FedProx, DriftStrategy):
    """Flower's FedProx: sends the ``prox`` objective's mu as ``proximal-mu``; the clients'
    ``prox`` objective adds the proximal term with it."""

    provides = frozenset({PROXIMAL_MU})

    @classmethod
    def arguments(cls, settings, *, model, aux_set, **_):
        return {"proximal_mu": settings.mu if settings.objective == "prox" else 0.0}


class FedAvgMSettings(StrategySettings):
    server_lr: float = Field(1.0, ge=0)  # eta_s
    server_momentum: float = Field(0.9, ge=0, lt=1)  # beta


class FedAvgM(FlowerFirst, flwr_strategy.FedAvgM, DriftStrategy):
    """Flower's server momentum, applied to DriftStrategy's checked aggregate."""

    Settings = FedAvgMSettings

    @classmethod
    def arguments(cls, settings, *, model, aux_set, **_):
        return {"server_learning_rate": settings.server_lr,
                "server_momentum": settings.server_momentum}

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None:
            return arrays, metrics
        # Flower's momentum step turns integer buffers (BatchNorm's num_batches_tracked) into
        # float arrays of another shape; keep every array's dtype and shape, and counters as
        # the checked aggregate has them.
        fixed = {}
        for key, value in to_numpy(arrays).items():
            ref = self.global_arrays[key]
            fixed[key] = (self.last_aggregate[key] if ref.dtype.kind != "f"
                          else np.asarray(value, dtype=ref.dtype).reshape(ref.shape))
        return to_record(fixed), metrics
