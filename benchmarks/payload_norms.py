"""The norms of honest clients' payloads, without DP: what privacy.payload_clip's per-method
defaults were chosen near (docs/privacy.md). For each method, rounds of in-process clients on
Fashion-MNIST; per round, the median, least and largest norm of the replies' payload terms
(SCAFFOLD's control delta, FedProto's and FedCSD's prototypes, FedCurv's Fisher terms F_k and
F_k * w_k) and the median norm of their model updates.

    .venv/bin/python benchmarks/payload_norms.py model=lenet5 num_clients=100 fraction=0.2 rounds=8
    .venv/bin/python benchmarks/payload_norms.py model=cnn num_clients=10 rounds=3
"""

from __future__ import annotations

import statistics
import sys

from _runs import in_process_federation

# each method in the setting privacy can cover, and how a reply's term reads
METHODS = {"scaffold": [], "fedproto": ["strategy.prototype_mean=plain"],
           "fedcsd": ["strategy.prototypes=previous"], "fedcurv": []}


def term_norm(reply) -> float:
    """The L2 norm of the reply's payload term, as privacy would clip it."""
    from driftfl.common.protocol import (CONTROL_DELTA, FEATURE_PROTOTYPES, FISHER,
                                         PROTOTYPES)
    from driftfl.strategies.parts.aggregation import model_norm, to_numpy

    records = reply.content.array_records
    if FISHER in records:  # FedCurv without privacy: F_k; the term adds F_k * w_k
        fisher, model = to_numpy(records[FISHER]), to_numpy(records["arrays"])
        return model_norm({**{f"F.{k}": f for k, f in fisher.items()},
                           **{f"G.{k}": f * model[k] for k, f in fisher.items()}})
    for name in (CONTROL_DELTA, FEATURE_PROTOTYPES, PROTOTYPES):
        if name in records:
            arrays = to_numpy(records[name])
            return model_norm(arrays if name == CONTROL_DELTA
                              else {"prototypes": arrays["prototypes"]})
    raise ValueError("the reply carries no payload")


def main(overrides: list[str]) -> None:
    from driftfl.common.protocol import model_to_arrays
    from driftfl.strategies.parts.aggregation import to_numpy, update_norm

    for method, settings in METHODS.items():
        cfg, model, strategy, grid, record = in_process_federation(
            [f"strategy={method}", *settings, *overrides])
        arrays = model_to_arrays(model)
        for server_round in range(1, cfg.rounds + 1):
            replies = list(grid.send_and_receive(strategy.configure_train(
                server_round, arrays, record, grid)))
            start = to_numpy(arrays)
            norms = [term_norm(r) for r in replies]
            updates = [update_norm(to_numpy(r.content["arrays"]), start) for r in replies]
            new, _ = strategy.aggregate_train(server_round, replies)
            arrays = new if new is not None else arrays
            print(f"{method:9s} round {server_round:2d}: payload norm median "
                  f"{statistics.median(norms):.3g} (least {min(norms):.3g}, largest "
                  f"{max(norms):.3g}); update norm median {statistics.median(updates):.3g}",
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
