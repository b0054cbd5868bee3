"""FedCurv's server: each node's latest diagonal Fisher terms, summed over the others.

Node k's accepted reply brings F_k (its diagonal Fisher at its trained model w_k); the server
keeps F_k and F_k * w_k (formed here from the reply's checked model) for every node whose reply
it accepted, the latest of each (the FedNTD reference keeps them the same way). Each train
message then carries, for its node k, P = sum_{j != k} F_j and Q = sum_{j != k} F_j * w_j: the
node's own terms are left out by the server, which knows exactly which of them it holds.

The terms are guarded like the model (guard.py). A reply is rejected when ||F_k|| is over
max_peer_ratio^2 (F is quadratic in the gradients) x the lower median of (a) the round's
replies' ||F_j|| and (b) every node's latest ||F_j|| with this round's replies in place of their
nodes' old ones: the sums span every node ever accepted, so a round with few replies (or the
attacker alone) is held to the stored terms too. The new sums P_all = sum_j F_j and
Q_all = sum_j F_j * w_j replace the old only when finite and moved by at most
max_update_ratio x max(1, their old norm) (from the first accepted round on; before it the
screens alone bound them); else every node keeps its old terms, the round's aggregate (plain
FedAvg, which passed its own checks) is still used, and the refusal is recorded in
``RoundReport.refused_state``. Robust aggregations change nothing here: each node's terms are
kept apart, not averaged, and the screens bound each one against its peers.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord

from driftfl.common.protocol import FISHER, FISHER_PENALTY

from . import guard
from .aggregation import model_norm
from .base import DriftStrategy

# A squared gradient component above this is no Fisher a sane model produces: corrupt or hostile.
FISHER_BOUND = 1e6


def check_fisher(record: ArrayRecord | None,
                 reference: dict[str, np.ndarray]) -> dict[str, np.ndarray] | str:
    """F_k by parameter name, or why it cannot be used: exactly the parameters' names, their
    shapes, floating, finite, non-negative and within FISHER_BOUND."""
    if record is None:
        return f"reply lacks the '{FISHER}' record"
    if set(record.keys()) != set(reference):
        return f"'{FISHER}' names other arrays than the model's parameters"
    fisher = {}
    for key, ref in reference.items():
        try:
            value = record[key].numpy()
        except Exception as err:  # unreadable bytes
            return f"'{FISHER}' array '{key}' cannot be read: {err!r}"
        if value.shape != ref.shape or value.dtype.kind != "f":
            return f"'{FISHER}' array '{key}' is {value.dtype}{list(value.shape)}"
        if not np.isfinite(value).all() or (value < 0).any() or (value > FISHER_BOUND).any():
            return (f"'{FISHER}' array '{key}' is not finite, non-negative and within "
                    f"{FISHER_BOUND:g}")
        fisher[key] = value.astype(np.float64)
    return fisher


class FedCurv(DriftStrategy):
    """``param_keys``: the model's trainable parameters (its other arrays are buffers)."""

    provides = frozenset({FISHER_PENALTY})
    # the server keeps each node's latest terms and sends the others their sum in every round,
    # sampled or not: no per-round clipped, noised or masked sum can stand in for them
    unprotected = ("its clients' Fisher terms, which it keeps per node and resends to all in "
                   "every round")

    def __init__(self, *, param_keys: frozenset[str], **kwargs):
        super().__init__(**kwargs)
        self.param_keys = param_keys
        self.fisher: dict[int, dict[str, np.ndarray]] = {}  # node -> F_k
        self.weighted: dict[int, dict[str, np.ndarray]] = {}  # node -> F_k * w_k
        self.checked: dict[int, dict[str, np.ndarray]] = {}  # this round's checked F_k
        self.norms: dict[int, float] = {}  # node -> ||F_k|| of its kept terms
        self.totals: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # key -> the sums of both

    @classmethod
    def arguments(cls, settings, *, model, aux_set, **_):
        return {"param_keys": frozenset(k for k, p in model.named_parameters()
                                        if p.requires_grad)}

    def rekey(self, moved: dict[int, int]) -> None:
        self.fisher = {moved.get(n, n): f for n, f in self.fisher.items()}
        self.weighted = {moved.get(n, n): g for n, g in self.weighted.items()}
        self.norms = {moved.get(n, n): v for n, v in self.norms.items()}

    def reject(self, update) -> str | None:
        reason = super().reject(update)
        if reason:
            return reason
        fisher = check_fisher(update.message.content.array_records.get(FISHER),
                              {k: self.global_arrays[k] for k in self.param_keys})
        if isinstance(fisher, str):
            return fisher
        self.checked[update.node_id] = fisher
        return None

    def screen(self, updates):
        # F_k is quadratic in the gradients: honest non-IID clients' norms spread as the
        # square of their updates' (13x seen among three CNN clients), hence max_peer_ratio^2
        size = lambda u: model_norm(self.checked[u.node_id])
        updates = self.peer_screen(updates, FISHER, size, power=2)
        kept = {**self.norms, **{u.node_id: size(u) for u in updates}}
        median = guard.lower_median(list(kept.values()))
        over = [u for u in updates if not kept[u.node_id] <= self.max_peer_ratio ** 2 * median]
        for u in over:
            self.record_rejection(self.report, u.node_id, (
                f"its {FISHER}'s norm {kept[u.node_id]:.3g} is over {self.ratio_text(2)} "
                f"x the kept nodes' median {median:.3g}"))
        return [u for u in updates if u not in over]

    def configure_train(self, server_round, arrays, config, grid):
        # the sums over every node's latest terms, once a round
        self.totals = sums(self.fisher, self.weighted, self.param_keys)
        return super().configure_train(server_round, arrays, config, grid)

    def node_knowledge(self, server_round: int, node: int) -> dict:
        if not self.fisher:  # nobody's terms yet (round 1)
            return {}
        own_f, own_g = self.fisher.get(node), self.weighted.get(node)
        arrays = {}
        for key, (f_sum, g_sum) in self.totals.items():
            penalty = f_sum - own_f[key] if own_f is not None else f_sum
            anchor = g_sum - own_g[key] if own_g is not None else g_sum
            arrays[f"penalty.{key}"] = Array(np.asarray(penalty, np.float32))
            arrays[f"anchor.{key}"] = Array(np.asarray(anchor, np.float32))
        return {FISHER_PENALTY: ArrayRecord(arrays)}

    def aggregate_train(self, server_round, replies):
        self.checked = {}
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None:
            return arrays, metrics
        # the accepted replies' terms, kept only if the sums they make are sane
        fisher, weighted = dict(self.fisher), dict(self.weighted)
        for update in self.last_updates:
            fisher[update.node_id] = self.checked[update.node_id]
            weighted[update.node_id] = {k: fisher[update.node_id][k] * update.arrays[k]
                                        for k in self.param_keys}
        problem = None
        if self.fisher:
            flat = lambda totals: {f"{part}.{k}": pair[i] for k, pair in totals.items()
                                   for i, part in enumerate(("penalty", "anchor"))}
            problem = self.state_problem(flat(sums(fisher, weighted, self.param_keys)),
                                         flat(sums(self.fisher, self.weighted, self.param_keys)))
        if problem:
            self.refuse_state(server_round, "FedCurv's Fisher sums", problem)
        else:
            self.fisher, self.weighted = fisher, weighted
            self.norms.update({u.node_id: model_norm(self.checked[u.node_id])
                               for u in self.last_updates})
        return arrays, metrics


def sums(fisher: dict[int, dict[str, np.ndarray]], weighted: dict[int, dict[str, np.ndarray]],
         keys) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """key -> (sum_j F_j, sum_j F_j * w_j) over the nodes kept."""
    return {k: (sum(f[k] for f in fisher.values()), sum(g[k] for g in weighted.values()))
            for k in keys}
