"""FedAvg: the example-weighted average of the client models, with the default parts; and the
methods that are FedAvg's server with another local objective or parts."""

from __future__ import annotations

from driftfl.strategies.base import DriftStrategy


class FedAvg(DriftStrategy):
    """The weighted average of the client models (with the default parts)."""

    method = "fedavg"
    # no server state of their own: the objective is the method (FedNova's and FedDisco's
    # yaml choose their aggregation, each a part)
    variants = {"fedlsd": "lsd", "fedntd": "ntd", "moon": "moon", "fednova": "ce",
                "feddisco": "ce"}
