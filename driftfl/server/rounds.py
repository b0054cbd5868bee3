"""The round loop: Flower's ``Strategy.start`` (flwr/serverapp/strategy/strategy.py) made to
begin at any round, so that a resumed run goes on after its checkpoint's round."""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import ArrayRecord, ConfigRecord

from driftfl.common.privacy import SecAggSettings
from driftfl.strategies import DriftStrategy

from .receive import receive_for


def run_rounds(strategy: DriftStrategy, federation, arrays: ArrayRecord, *, first_round: int,
               num_rounds: int, timeout: float, train_config: ConfigRecord,
               evaluate_config: ConfigRecord,
               evaluate_fn: Callable[[int, ArrayRecord], object],
               after_round: Callable[[int, ArrayRecord], None],
               secagg: SecAggSettings | None = None,
               before_train: Callable[[int], None] = lambda server_round: None) -> str:
    """Rounds ``first_round``..``num_rounds`` as Flower runs them (train, federated
    evaluation, central evaluation), then ``after_round``, over the ``federation``'s grid,
    which sets each round's nodes first and settles who was lost after training. Round 0's
    central evaluation comes first in a run that starts at round 1. Training goes through the
    receive part the experiment's ``secagg`` chooses (receive.py: plain, or SecAgg+). Returns
    why the run stopped early ("" if it did not): the strategy's ``stop_before`` (the privacy
    budget). ``before_train`` runs as a round's training is about to go out (the privacy
    ledger's charge)."""
    if first_round == 1:
        evaluate_fn(0, arrays)
    grid, receive = federation.grid, receive_for(secagg)
    for server_round in range(first_round, num_rounds + 1):
        if stop := strategy.stop_before(server_round):
            print(f"driftfl: {stop}", flush=True)
            return stop
        federation.begin_round(server_round)
        before_train(server_round)
        aggregate = receive.train(strategy, grid, server_round, arrays, train_config, timeout)
        federation.settle(strategy)
        if aggregate is not None:
            arrays = aggregate
        replies = grid.send_and_receive(
            strategy.configure_evaluate(server_round, arrays, evaluate_config, grid),
            timeout=timeout)
        strategy.aggregate_evaluate(server_round, replies)
        evaluate_fn(server_round, arrays)
        after_round(server_round, arrays)
    return ""
