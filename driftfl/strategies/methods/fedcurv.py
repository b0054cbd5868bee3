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

Where the release sums payloads (DP, secure aggregation: ``summed``) the server may hold no
node's terms, only totals: each accepted reply brings the change of its node's terms since
those the totals hold (``fisher-delta``: F and F * w, clipped to privacy.payload_clip and
noised under DP, masked under SecAgg+; the release reads and bounds them), the totals P_all,
Q_all grow by the round's (noised) sum of the changes, and ``included`` records, per node, the round whose terms the totals now hold. Each train
message carries the totals and that round; the node takes its own terms out itself
(client/objectives/curv.py). Without noise this is the same method: P_all and Q_all are the
sums over every node's latest accepted terms. Under DP each round's noise stays in the totals.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord

from driftfl.common.protocol import FISHER, FISHER_PENALTY, INCLUDED_ROUND
from driftfl.specs import methods as declared
from driftfl.strategies.base import DriftStrategy
from driftfl.strategies.parts import guard
from driftfl.strategies.parts.aggregation import model_norm, update_norm

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

    spec = declared.FEDCURV
    payload_words = "FedCurv's Fisher term changes"

    def __init__(self, *, param_keys: frozenset[str], **kwargs):
        super().__init__(**kwargs)
        self.param_keys = param_keys
        self.totals_f: dict[str, np.ndarray] = {}  # summed: P_all, Q_all by parameter
        self.totals_g: dict[str, np.ndarray] = {}
        self.included: dict[int, int] = {}  # summed: node -> the round its terms are from
        self.fisher: dict[int, dict[str, np.ndarray]] = {}  # node -> F_k
        self.weighted: dict[int, dict[str, np.ndarray]] = {}  # node -> F_k * w_k
        self.checked: dict[int, dict[str, np.ndarray]] = {}  # this round's checked F_k
        self.norms: dict[int, float] = {}  # node -> ||F_k|| of its kept terms
        self.totals: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # key -> the sums of both

    @classmethod
    def arguments(cls, settings, *, model, aux_set, **_):
        return {"param_keys": frozenset(k for k, p in model.named_parameters()
                                        if p.requires_grad)}

    @property
    def summed(self) -> bool:
        """Whether the release takes the payload as a sum: then totals only (above)."""
        return self.release.sums_payloads

    @property
    def sends_payload(self) -> bool:
        return self.summed

    def payload(self) -> dict[str, tuple[int, ...]]:
        if not self.summed:
            return {}
        return {name: self.global_arrays[name[2:]].shape for name in sorted(
            f"{part}.{k}" for part in "FG" for k in self.param_keys)}

    def rekey(self, moved: dict[int, int]) -> None:
        self.included = {moved.get(n, n): r for n, r in self.included.items()}
        self.fisher = {moved.get(n, n): f for n, f in self.fisher.items()}
        self.weighted = {moved.get(n, n): g for n, g in self.weighted.items()}
        self.norms = {moved.get(n, n): v for n, v in self.norms.items()}

    def check_payload(self, update) -> str | None:
        """F_k as the client computed it (a summed change is read by the release)."""
        if self.summed:
            return None
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
        updates = self.guard.peer_screen(self.report, updates, FISHER, size, power=2)
        kept = {**self.norms, **{u.node_id: size(u) for u in updates}}
        median = guard.peer_bar(list(kept.values()))  # (inf: fewer than three set none)
        over = [u for u in updates if not kept[u.node_id] <= self.max_peer_ratio ** 2 * median]
        for u in over:
            self.guard.refuse_reply(self.report, u.node_id, (
                f"its {FISHER}'s norm {kept[u.node_id]:.3g} is over {self.guard.ratio_text(2)} "
                f"x the kept nodes' median {median:.3g}"), by_peers=True)
        return [u for u in updates if u not in over]

    def configure_train(self, server_round, arrays, config, grid):
        # the sums over every node's latest terms, once a round
        self.totals = {} if self.summed else sums(self.fisher, self.weighted, self.param_keys)
        return super().configure_train(server_round, arrays, config, grid)

    def node_knowledge(self, server_round: int, node: int) -> dict:
        if self.summed:  # the totals, and which of this node's terms they hold
            if not self.totals_f:
                return {}
            arrays = {f"{name}.{k}": Array(np.asarray(totals[k], np.float32))
                      for name, totals in (("penalty", self.totals_f), ("anchor", self.totals_g))
                      for k in sorted(self.param_keys)}
            arrays[INCLUDED_ROUND] = Array(np.array([self.included.get(node, -1)], np.int64))
            return {FISHER_PENALTY: ArrayRecord(arrays)}
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
        if self.summed:
            self.add_changes(server_round)
            return arrays, metrics
        # the accepted replies' terms, kept only if the sums they make are sane
        fisher, weighted = dict(self.fisher), dict(self.weighted)
        # each node's terms, bounded as the aggregation bounds a client's part (trust=none)
        terms = self.aggregation.bound([self.checked[u.node_id] for u in self.last_updates])
        for update, term in zip(self.last_updates, terms):
            fisher[update.node_id] = term
            weighted[update.node_id] = {k: term[k] * update.arrays[k] for k in self.param_keys}
        flat = lambda totals: {f"{part}.{k}": pair[i] for k, pair in totals.items()
                               for i, part in enumerate(("penalty", "anchor"))}
        # a node's new terms replace its last ones: the sums move by the round's changes (in
        # round 1 too: from nothing, by every node's first terms)
        own = lambda f, g, n: flat({k: (f[n][k], g[n][k]) for k in self.param_keys})
        changes = [update_norm(own(fisher, weighted, n), own(self.fisher, self.weighted, n))
                   if n in self.fisher else model_norm(own(fisher, weighted, n))
                   for n in (u.node_id for u in self.last_updates)]
        problem = self.guard.state_problem(
            flat(sums(fisher, weighted, self.param_keys)),
            flat(sums(self.fisher, self.weighted, self.param_keys)) if self.fisher else None,
            scale=guard.move_scale(changes, len(changes)))
        if problem:
            self.guard.refuse_state(self.report, server_round, "FedCurv's Fisher sums", problem)
        else:
            self.fisher, self.weighted = fisher, weighted
            self.norms.update({u.node_id: model_norm(fisher[u.node_id])
                               for u in self.last_updates})
        return arrays, metrics

    def add_changes(self, server_round: int) -> None:
        """The totals plus the round's (noised) sum of the changes, if sane; the nodes summed
        then have this round's terms in them."""
        zeros = {k: np.zeros(self.global_arrays[k].shape) for k in self.param_keys}
        old_f, old_g = self.totals_f or zeros, self.totals_g or zeros
        new_f = {k: old_f[k] + self.payload_sum[f"F.{k}"] for k in self.param_keys}
        new_g = {k: old_g[k] + self.payload_sum[f"G.{k}"] for k in self.param_keys}
        flat = lambda f, g: {**{f"F.{k}": v for k, v in f.items()},
                             **{f"G.{k}": v for k, v in g.items()}}
        problem = self.guard.state_problem(flat(new_f, new_g), flat(old_f, old_g) if self.totals_f
                                     else None, self.payload_floor(1))
        if problem:
            self.guard.refuse_state(self.report, server_round, "FedCurv's Fisher sums", problem)
            return
        self.totals_f, self.totals_g = new_f, new_g
        self.included.update({u.node_id: server_round for u in self.last_updates})


def sums(fisher: dict[int, dict[str, np.ndarray]], weighted: dict[int, dict[str, np.ndarray]],
         keys) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """key -> (sum_j F_j, sum_j F_j * w_j) over the nodes kept."""
    return {k: (sum(f[k] for f in fisher.values()), sum(g[k] for g in weighted.values()))
            for k in keys}
