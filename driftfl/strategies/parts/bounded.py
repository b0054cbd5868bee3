"""Where clients are not trusted (``trust=none``): each client's influence on the model and on
every piece of strategy state is bounded, whatever formula the method averages with.

Every vector a client contributes (its model update w_k - w_G; a payload that feeds state:
SCAFFOLD's Delta c_k, FedDyn's move, a class's prototype, FedCurv's Fisher term) is first moved
to within tau of a robust centre m, the coordinate-wise median of the round's vectors:

    x_k' = m + (x_k - m) min(1, tau / ||x_k - m||),  tau = clip_ratio x lower median_k ||x_k - m||

then the method's own formula (FedAvg's weighted mean, FedNova's, FedDisco's, the paper's mean of
a payload) takes the x_k'. This is one step of centred clipping (Karimireddy, He & Jaggi,
"Learning from History for Byzantine Robust Optimization", ICML 2021) started from the median.
While most of a round's clients are honest, m lies among the honest values in every coordinate
and tau is an honest distance (the lower median cannot be raised by one client), so one client
moves an average by at most its weight x tau from where the honest clients would put it, however
far it pushes; the clients within tau of the centre are used exactly as sent. With two vectors m
is their mean and both are at the same distance: nothing is clipped (two clients cannot show
which of them is honest).

Why not the paper's formula: a mean lets one client move it without limit. Why not the median or
trimmed mean (``aggregation=median``): under label skew the clients' updates differ by design,
and a coordinate-wise median discards what the minority of clients holding a class learned.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from driftfl.specs.parts import replies_per_round
from driftfl.strategies.parts.aggregation import Aggregation, ClientUpdate, update_norm
from driftfl.strategies.parts.guard import nonzero_lower_median
from driftfl.strategies.parts.history import History

Vectors = list[dict[str, np.ndarray]]


def centred_clip(vectors: Vectors, ratio: float) -> tuple[Vectors, list[float]]:
    """(the vectors moved to within tau of their coordinate-wise median, each one's factor
    min(1, tau / distance)); float64, floating arrays only (others are left as they are)."""
    out, factors, _ = clip_about_median(vectors, ratio)
    return out, factors


def clip_about_median(vectors: Vectors, ratio: float
                      ) -> tuple[Vectors, list[float], dict[str, np.ndarray] | None]:
    """``centred_clip``'s (vectors, factors) and the centre (None: fewer than 3 vectors)."""
    if len(vectors) < 3:
        return vectors, [1.0] * len(vectors), None
    keys = [k for k, v in vectors[0].items() if v.dtype.kind == "f"]
    centre = {k: np.median(np.stack([v[k] for v in vectors]), axis=0).astype(np.float64)
              for k in keys}
    distances = [update_norm(v, centre) for v in vectors]
    tau = ratio * nonzero_lower_median(distances)  # vectors at the centre set no bar
    factors = [min(1.0, tau / d) if d > 0 else 1.0 for d in distances]
    out = []
    for v, f in zip(vectors, factors):
        if f == 1.0:
            out.append(v)
        else:
            out.append({**v, **{k: centre[k] + f * (v[k].astype(np.float64) - centre[k])
                                for k in keys}})
    return out, factors, centre


class BoundedAggregation(Aggregation):
    """``inner`` (the method's own rule: the plain mean, FedNova's, FedDisco's) on the replies
    moved to within ``clip_ratio`` x the round's lower median distance of their median."""

    robust = True  # payloads are combined here too, each client's bounded alike
    bounds_updates = True  # the replies' models are bounded before anything uses them
    individual = "bounding each client's influence needs every client's individual update"
    name = "bounded"

    def __init__(self, inner: Aggregation, clip_ratio: float) -> None:
        self.inner = inner
        self.clip_ratio = clip_ratio
        self.clipped: dict[int, float] = {}  # node -> factor, of the last aggregate's replies
        self.history = History(lambda vectors: centred_clip(vectors, clip_ratio))
        self.nodes: list[int] = []  # the last bound replies' nodes, in their order

    def meet(self, clients):
        self.inner.meet(clients)

    def rekey(self, moved):
        self.inner.rekey(moved)
        self.history.rekey(moved)

    def reject(self, update):
        return self.inner.reject(update)

    def refuse(self, updates):
        return self.inner.refuse(updates)

    def weights(self, updates):
        return self.inner.weights(updates)

    def bound_updates(self, updates: list[ClientUpdate], global_arrays):
        moves = [{k: u.arrays[k].astype(np.float64) - global_arrays[k] for k in global_arrays
                  if global_arrays[k].dtype.kind == "f"} for u in updates]
        self.nodes = [u.node_id for u in updates]
        bounded, factors = self.bound_history("model", self.nodes, moves)
        self.clipped = {u.node_id: f for u, f in zip(updates, factors) if f < 1.0}
        return [u if f == 1.0 else replace(u, arrays={
            **u.arrays, **{k: (global_arrays[k] + m[k]).astype(u.arrays[k].dtype)
                           for k in m}}) for u, m, f in zip(updates, bounded, factors)]

    def aggregate(self, updates: list[ClientUpdate], global_arrays):
        return self.inner.aggregate(updates, global_arrays)  # bounded in ``bound_updates``

    def combine(self, payloads, weights, among=None):
        """The method's formula on the payloads bounded in the round and over the rounds
        (history.py): a payload's history is named by its keys (prototypes.combined names
        each class's), its client by its position in the last bound replies."""
        positions = range(len(payloads)) if among is None else among
        if len(self.nodes) < len(payloads) or max(positions, default=0) >= len(self.nodes):
            return self.inner.combine(self.bound(payloads), weights, among)  # no replies known
        stream = "payload:" + ",".join(payloads[0])
        return self.inner.combine(self.bound_history(
            stream, [self.nodes[i] for i in positions], payloads)[0], weights, among)

    def bound_history(self, stream: str, nodes: list[int], vectors: Vectors
                      ) -> tuple[Vectors, list[float]]:
        """The vectors bounded in their round (``centred_clip``) and then each node's sum of
        them over the rounds of ``stream`` (``History``); each one's smaller factor."""
        bounded, factors, centre = clip_about_median(vectors, self.clip_ratio)
        if centre is None:
            return bounded, factors
        bounded, summed = self.history.bound(stream, nodes, bounded, centre)
        return bounded, [min(f, g) for f, g in zip(factors, summed)]

    def standalone(self):
        """Payloads combined before the round's replies are bounded (FedCSD's prototype
        phase) are bounded in their round only: their clients' positions are not the last
        bound replies'."""
        return BoundedAggregation(self.inner.standalone(), self.clip_ratio)

    def bound(self, payloads: Vectors) -> Vectors:
        return centred_clip(payloads, self.clip_ratio)[0]


def untrusted(cfg, deployed: bool) -> bool:
    """Whether this experiment's clients are not trusted: trust=none, or trust=auto in
    deployment (nodes of other owners, each running what it likes)."""
    return cfg.trust == "none" or (cfg.trust == "auto" and deployed)


def where_unbounded(cfg, aggregation: Aggregation) -> str:
    """Why an untrusted experiment's aggregation is not wrapped in BoundedAggregation ("": it
    is): privacy's clip bounds each client already (a screen against peers would let one
    client's data decide another's part, outside the mechanism), secure aggregation shows no
    client's own update, a robust rule was chosen."""
    if cfg.privacy.enabled:
        return (f"privacy={cfg.privacy.name}: each client's influence is bounded by the clip "
                f"({cfg.privacy.clip:g})")
    if cfg.secagg.enabled:
        return ("secagg=secaggplus: the server sees no client's own update, so it cannot bound "
                "one client's; each masked coordinate stays within secagg.clipping_range and "
                "the released update within its hold, but one client inside the protocol can "
                "still steer each round (docs/security.md)")
    if aggregation.robust:
        return f"aggregation={cfg.aggregation.name} bounds each client's influence"
    return ""


def bounded_for(cfg, aggregation: Aggregation, deployed: bool) -> Aggregation:
    """The experiment's aggregation, bounded where its clients are not trusted and nothing
    else bounds them (``where_unbounded``)."""
    if untrusted(cfg, deployed) and not where_unbounded(cfg, aggregation):
        return BoundedAggregation(aggregation, cfg.clip_ratio)
    return aggregation


def trust_line(cfg, aggregation: Aggregation, deployed: bool) -> str:
    """The run's line on whose replies are trusted and what bounds them (every run has one:
    trusted clients in simulation are said to be trusted, with what trust=none would change)."""
    if not untrusted(cfg, deployed):
        if not deployed:
            return (f"driftfl: clients trusted (trust={cfg.trust} in simulation): each method's "
                    "own formula, so one client can steer the model and the method's state "
                    "without limit; trust=none bounds each client's influence")
        return ("driftfl: warning: trust=clients: each method averages as its paper does, so "
                "one client inside the checks can steer the model and the method's state; "
                "trust=none (the default here) bounds each client's influence")
    if isinstance(aggregation, BoundedAggregation) and replies_per_round(cfg) < 3:
        return too_few_to_bound(cfg, deployed)
    if not isinstance(aggregation, BoundedAggregation):
        warning = "warning: " if cfg.secagg.enabled and not cfg.privacy.enabled else ""
        return (f"driftfl: {warning}clients not trusted (trust={cfg.trust}); "
                f"{where_unbounded(cfg, aggregation)}")
    return (f"driftfl: clients not trusted (trust={cfg.trust}): each client's update and every "
            f"payload that feeds the method's state are moved to within {cfg.clip_ratio:g} x "
            "the round's median distance of the clients' median, and each client's sum of "
            "them over the rounds within the same bound of the others' sums, before the "
            "method's own formula, so one client moves them by at most its weight x that "
            "distance over the run; a round with fewer than 3 replies is used as sent; the "
            "paper's plain mean would let one client move them without limit")


def too_few_to_bound(cfg, deployed: bool) -> str:
    """The line of an untrusted run with fewer than 3 clients a round: no bound is possible
    (two replies cannot show which of them is honest), and where nodes claim their example
    counts, what one that lies gets: r / (r + n - 1) of the mean (the cap is r x the lower
    median count, the honest one's with two)."""
    n, r = replies_per_round(cfg), cfg.max_examples_ratio
    liar = (f"; a node claiming more examples than it holds weighs up to {r:g} / ({r:g} + "
            f"{n - 1}) = {r / (r + n - 1):.1%} of the mean (max_examples_ratio={r:g}) unless "
            "owners= declares its count" if deployed and n > 1 else "")
    return (f"driftfl: warning: clients not trusted (trust={cfg.trust}), but with {n} "
            f"client{'s' if n != 1 else ''} a round no bound is possible (two replies cannot "
            "show which of them is honest): each reply is used as sent, so one client can "
            f"steer the model and the method's state without limit{liar}; 3 clients a round or "
            "more are bounded")
