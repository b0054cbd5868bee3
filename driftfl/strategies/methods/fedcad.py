"""FedCAD's server: FedAvg, plus (with alpha_source=aux) E_{x|y}[phi] per class measured on the
aux set, from which the clients derive their class weights alpha_y; with alpha_source=local
the clients estimate it on their own data."""

from __future__ import annotations

from flwr.app import Array, ArrayRecord

from driftfl.common.protocol import CLASS_PHI
from driftfl.specs import methods as declared
from driftfl.strategies.base import DriftStrategy
from driftfl.strategies.parts.aux_set import AuxSet


class FedCAD(DriftStrategy):
    spec = declared.FEDCAD

    def __init__(self, *, aux_set: AuxSet | None, **kwargs):
        super().__init__(**kwargs)
        self.aux_set = aux_set  # None: the clients estimate E_{x|y}[phi] themselves

    @classmethod
    def arguments(cls, settings, *, model, aux_set, **_):
        return {"aux_set": aux_set}

    def knowledge(self, server_round: int) -> dict:
        if self.aux_set is None:
            return {}
        return {CLASS_PHI: ArrayRecord({"phi": Array(self.aux_set.class_phi(self.global_arrays))})}
