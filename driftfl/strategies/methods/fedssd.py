"""FedSSD's server: each round, the global model's row-normalised confusion matrix on the aux
set (the credibility matrix A) goes to the clients with the global model."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord

from driftfl.common.protocol import CREDIBILITY
from driftfl.specs import methods as declared
from driftfl.strategies.base import DriftStrategy
from driftfl.strategies.parts.aux_set import AuxSet


class FedSSD(DriftStrategy):
    spec = declared.FEDSSD
    server_columns = frozenset({"credibility_diag_mean"})

    def __init__(self, *, aux_set: AuxSet, **kwargs):
        super().__init__(**kwargs)
        self.aux_set = aux_set
        self.credibility: np.ndarray | None = None  # this round's, from the aux set

    @classmethod
    def arguments(cls, settings, *, model, aux_set, **_):
        return {"aux_set": aux_set}

    def knowledge(self, server_round: int) -> dict:
        self.credibility = self.aux_set.confusion(self.global_arrays)
        return {CREDIBILITY: ArrayRecord({"matrix": Array(self.credibility)})}

    def server_metrics(self, accuracy_of) -> dict[str, float]:
        return {"credibility_diag_mean": float(np.mean(np.diag(self.credibility)))}

    def round_arrays(self) -> dict[str, np.ndarray]:
        return {"credibility": self.credibility}
