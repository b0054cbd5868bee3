"""FedCAD's server: FedAvg, plus (with alpha_source=aux) E_{x|y}[phi] per class measured on the
auxiliary set, from which the clients derive their class weights alpha_y."""

from __future__ import annotations

from flwr.app import Array, ArrayRecord

from driftfl.common.protocol import CLASS_PHI

from .base import DriftStrategy


class FedCAD(DriftStrategy):
    provides = frozenset({CLASS_PHI})
    auxiliary = None  # an AuxiliarySet when alpha_source=aux, set by build_strategy

    @staticmethod
    def uses_auxiliary_set(params) -> bool:
        return params.get("alpha_source") == "aux"

    def knowledge(self, server_round: int) -> dict:
        if self.auxiliary is None:
            return {}
        return {CLASS_PHI: ArrayRecord({"phi": Array(self.auxiliary.class_phi(self.global_arrays))})}
