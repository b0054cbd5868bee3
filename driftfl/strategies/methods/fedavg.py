"""FedAvg: the example-weighted average of the client models, with the default parts."""

from __future__ import annotations

from driftfl.strategies.base import DriftStrategy


class FedAvg(DriftStrategy):
    """The weighted average of the client models (with the default parts)."""
