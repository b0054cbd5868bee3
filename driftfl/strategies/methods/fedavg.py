"""FedAvg: the example-weighted average of the client models, with the default parts; and the
methods that are FedAvg's server with another local objective or parts."""

from __future__ import annotations

from driftfl.specs import methods as declared
from driftfl.strategies.base import DriftStrategy


class FedAvg(DriftStrategy):
    """The weighted average of the client models (with the default parts)."""

    spec = declared.FEDAVG  # and its variants, the methods that only change the objective
