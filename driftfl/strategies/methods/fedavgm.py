"""FedAvgM: Flower's own server momentum, applied to DriftStrategy's checked aggregate."""

from __future__ import annotations

import numpy as np
from flwr.serverapp import strategy as flwr_strategy

from driftfl.specs import methods as declared
from driftfl.strategies.base import DriftStrategy
from driftfl.strategies.flower_first import FlowerFirst
from driftfl.strategies.parts.aggregation import to_numpy, to_record


class FedAvgM(FlowerFirst, flwr_strategy.FedAvgM, DriftStrategy):
    """Flower's server momentum, applied to DriftStrategy's checked aggregate."""

    spec = declared.FEDAVGM

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
