"""FedSSD's server: each round, the global model's row-normalised confusion matrix on the
auxiliary set (the credibility matrix A) goes to the clients with the global model."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord

from driftfl.common.protocol import CREDIBILITY

from .base import DriftStrategy


class FedSSD(DriftStrategy):
    provides = frozenset({CREDIBILITY})
    auxiliary = None  # an AuxiliarySet, set by build_strategy

    @staticmethod
    def uses_auxiliary_set(params) -> bool:
        return True

    def knowledge(self, server_round: int) -> dict:
        self.credibility = self.auxiliary.confusion(self.global_arrays)
        return {CREDIBILITY: ArrayRecord({"matrix": Array(self.credibility)})}

    def server_metrics(self, accuracy_of) -> dict[str, float]:
        return {"credibility_diag_mean": float(np.mean(np.diag(self.credibility)))}

    def round_arrays(self) -> dict[str, np.ndarray]:
        return {"credibility": self.credibility}
