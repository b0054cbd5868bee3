"""FedProx: Flower's own strategy (its ``proximal-mu`` in every train message) on driftfl's
round; the clients' ``prox`` objective adds the proximal term."""

from __future__ import annotations

from flwr.serverapp import strategy as flwr_strategy

from driftfl.specs import methods as declared
from driftfl.strategies.base import DriftStrategy
from driftfl.strategies.flower_first import FlowerFirst


class FedProx(FlowerFirst, flwr_strategy.FedProx, DriftStrategy):
    """Flower's FedProx: sends the ``prox`` objective's mu as ``proximal-mu``; the clients'
    ``prox`` objective adds the proximal term with it."""

    spec = declared.FEDPROX

    @classmethod
    def arguments(cls, settings, *, model, aux_set, **_):
        return {"proximal_mu": settings.mu if settings.objective == "prox" else 0.0}
