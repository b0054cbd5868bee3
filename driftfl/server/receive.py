"""The receive part of a round, chosen once from config (``secagg=``): how the strategy's train
messages go out and what comes back to its ``aggregate_train``.

- ``PlainReceive``: the grid's send-and-receive; every reply as it arrived.
- ``SecureReceive``: Flower's SecAgg+ protocol over the same messages (driftfl.server.secure):
  a ``SecureSum``, the replies' clear metrics and the unmasked sum, never one update.

Either hands the strategy's own ``aggregate_train`` what it received, so the guard, the release,
the aggregation and the method's state update run alike.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid

from driftfl.common.privacy import SecAggSettings
from driftfl.strategies import DriftStrategy

from .secure import secure_train_round


class PlainReceive:
    def train(self, strategy: DriftStrategy, grid: Grid, server_round: int, arrays: ArrayRecord,
              config: ConfigRecord, timeout: float) -> ArrayRecord | None:
        """The round's new global model (None: the model stays)."""
        replies = grid.send_and_receive(
            strategy.configure_train(server_round, arrays, config, grid), timeout=timeout)
        aggregate, _ = strategy.aggregate_train(server_round, replies)
        return aggregate


class SecureReceive:
    def __init__(self, settings: SecAggSettings) -> None:
        self.settings = settings
        self.released: list[float] = []  # the norms of the updates the rounds released

    def train(self, strategy, grid, server_round, arrays, config, timeout):
        return secure_train_round(strategy, grid, self.settings, server_round, arrays, config,
                                  timeout, self.released)


def receive_for(secagg: SecAggSettings | None) -> PlainReceive | SecureReceive:
    """The receive part the experiment's ``secagg`` section chooses."""
    return SecureReceive(secagg) if secagg is not None and secagg.enabled else PlainReceive()
