"""What one reply's class prototypes may do to the global prototypes (FedProto's feature
prototypes, FedCSD's logit prototypes).

The reply checks (``fedcsd.check_prototypes``: finite, within +-1e4, counts whole and summing to
at most the survey's count) leave a hostile client free to put 1e4 on a class it does not hold,
or to send a prototype a thousand times its peers'. Three rules close that; a reply that breaks
one is rejected whole, like a failed check:

- **Survey.** The counts agree with the node's label histogram from the data survey: at most the
  histogram's count per class, and a class the node does not hold has count 0 and a zero row.
- **Peers.** A held class's prototype norm is at most ``max_peer_ratio`` x the lower median
  of that class's non-zero prototype norms this round, over the replies holding it
  (``guard.peer_bar``: one zero or tiny prototype must not make every other one outsized); a
  class that fewer than three replies hold with a non-zero row (one holder could set the bar
  of the other) is measured against the lower median of each reply's median held norm
  (features and logits of one model have norms of one order; one value a reply, so that a
  client holding many classes does not set it), and with fewer than three such replies, not
  at all. A reply refused by this rule is refused by its peers (no strike: guard.py).
- **Global.** Where the class has a global prototype, ||P_k,c - P_G,c|| may be at most
  ``max_update_ratio`` x max(1, ||P_G,c||), as a model update against the global model.

The new global prototypes replace the old ones only if ``guard.state_problem`` passes on the
classes both hold (``common_rows``). Under a robust aggregation P_G,c is the aggregation's
``combine`` of the holders' P_k,c (``combined``) instead of the paper's mean.

Where the release sums payloads (DP, secure aggregation) the server gets only the sum of the
clients' P_k (clipped and noised under DP; base.py's ``payload_sum``) and makes P_G of it
(``from_sum``) with public denominators: the holders the release names (``Released.holders``:
the clients summed, or under central DP every client times the sampling rate, a fixed
denominator that says nothing of the secret sample), counted from the data survey's label
histograms.
"""

from __future__ import annotations

import numpy as np

from driftfl.strategies.parts import guard

Replies = list[tuple[np.ndarray, np.ndarray]]  # (P_k (C, d), counts (C,)) per reply


def survey_problem(prototypes: np.ndarray, counts: np.ndarray,
                   histogram: np.ndarray | None) -> str | None:
    """Why these counts and rows disagree with the node's label histogram (None: they agree,
    or there was no survey)."""
    if histogram is None:
        return None
    over = np.flatnonzero(counts > histogram)
    if len(over):
        return (f"counts {counts[over].astype(np.int64).tolist()} of classes {over.tolist()} "
                f"exceed the data survey's {histogram[over].tolist()}")
    ghost = np.flatnonzero((histogram == 0) & np.abs(prototypes).any(axis=1))
    if len(ghost):
        return f"prototypes of classes {ghost.tolist()}, which the node does not hold"
    return None


def outliers(replies: Replies, global_prototypes: np.ndarray | None, present: np.ndarray,
             peer_ratio: float, update_ratio: float) -> dict[int, tuple[str, bool]]:
    """Position -> (why, whether a peer bar refused it), for the replies whose held prototypes
    break the peer or the global rule."""
    if not replies:
        return {}
    norms = np.stack([np.linalg.norm(p.astype(np.float64), axis=1) for p, _ in replies])
    held = np.stack([c > 0 for _, c in replies])
    pooled = guard.peer_bar([guard.lower_median(norms[k, held[k]].tolist())
                             for k in range(len(replies)) if held[k].any()])
    reasons: dict[int, tuple[str, bool]] = {}
    for c in range(held.shape[1]):
        holders = np.flatnonzero(held[:, c])
        median = guard.peer_bar(norms[holders, c].tolist())
        median = pooled if np.isinf(median) else median
        for k in holders:
            if not norms[k, c] <= peer_ratio * median:
                reasons.setdefault(k, (f"its class-{c} prototype's norm {norms[k, c]:.3g} is "
                                       f"over max_peer_ratio={peer_ratio:g} x the round's "
                                       f"median {median:.3g}", True))
            elif global_prototypes is not None and present[c]:
                old = global_prototypes[c].astype(np.float64)
                moved = float(np.linalg.norm(replies[k][0][c] - old))
                bound = update_ratio * max(1.0, float(np.linalg.norm(old)))
                if not moved <= bound:
                    reasons.setdefault(k, (f"its class-{c} prototype is {moved:.3g} from the "
                                           f"global one, over the bound {bound:.3g} "
                                           "(max_update_ratio)", False))
    return reasons


def screened(strategy, updates: list, replies: Replies) -> list:
    """The ``updates`` whose prototypes (``replies``, in the same order) pass ``outliers``
    against the round's peers and the strategy's P_G; the others are refused in the round's
    report, a peer bar's refusal as such (no strike: guard.py)."""
    bad = outliers(replies, strategy.prototypes, strategy.present, strategy.max_peer_ratio,
                   strategy.max_update_ratio)
    for k, (reason, by_peers) in bad.items():
        strategy.guard.refuse_reply(strategy.report, updates[k].node_id, reason,
                                    by_peers=by_peers)
    return [u for k, u in enumerate(updates) if k not in bad]


def common_rows(new: np.ndarray, new_present: np.ndarray, old: np.ndarray | None,
                old_present: np.ndarray) -> tuple[dict, dict] | None:
    """(new, old) on the classes both hold, for ``state_problem``; a class new this round has
    no old value to be measured from (the peer rule bounded it). None: no old state yet."""
    if old is None:
        return None
    both = new_present & old_present
    return {"prototypes": new[both]}, {"prototypes": old[both]}


def prototype_scale(replies: Replies, old: np.ndarray | None,
                    old_present: np.ndarray) -> float | None:
    """The honest scale of P_G's move on the classes it already holds (``guard.move_scale``):
    per class, the lower median over its holders of ||P_k,c - P_G,c||, over the classes in
    quadrature (None: no such class this round)."""
    if old is None:
        return None
    medians = []
    for c in np.flatnonzero(old_present):
        moves = [float(np.linalg.norm(p[c].astype(np.float64) - old[c])) for p, counts in replies
                 if counts[c] > 0]
        if moves:
            medians.append(guard.lower_median(moves))
    return float(np.sqrt(np.sum(np.square(medians)))) if medians else None


def holders(histograms: dict[int, np.ndarray], nodes, num_classes: int) -> np.ndarray:
    """h_c: how many of ``nodes`` hold class c, by their surveyed label histograms."""
    count = np.zeros(num_classes)
    for node in nodes:
        count += np.asarray(histograms[node]) > 0
    return count


def from_sum(total: np.ndarray, held_by: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P_G, present) from the sum of the clients' prototypes: P_G,c = total_c / h_c, a zero
    row for a class no client counted holds (h_c may be an expected count: central DP's)."""
    present = held_by > 0
    mean = total / np.where(present, held_by, 1.0)[:, None]
    return np.where(present[:, None], mean, 0.0).astype(np.float32), present


def summed(strategy, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(P_G, present) from a protected round's sum (``strategy.payload_sum``), over the holders
    the release names (``strategy.released``)."""
    released = strategy.released
    return from_sum(strategy.payload_sum["prototypes"], released.holder_share * holders(
        strategy.clients.histograms, released.holders, num_classes))


def noise_floor(strategy, old: dict) -> float:
    """How far a new P_G made of a noised sum may lie from the old one: as far as that sum
    reaches (guard's ``payload_floor``) plus the old one's norm; 0 without privacy."""
    floor = strategy.payload_floor(1)
    return floor + float(np.linalg.norm(old["prototypes"])) if floor else 0.0


def combined(aggregation, replies: Replies, num_classes: int, dim: int,
             by_counts: bool) -> tuple[np.ndarray, np.ndarray]:
    """(P_G, present) by a robust aggregation's ``combine``, per class over the replies holding
    it (weighted by their counts, or uniformly), positions as in the last aggregate's replies."""
    out = np.zeros((num_classes, dim), dtype=np.float32)
    present = np.zeros(num_classes, dtype=bool)
    for c in range(num_classes):
        holders = [k for k, (_, counts) in enumerate(replies) if counts[c] > 0]
        weights = np.array([replies[k][1][c] if by_counts else 1.0 for k in holders], np.float64)
        name = f"class-{c}"  # (trust=none keeps each class's history apart: bounded.py)
        merged = aggregation.combine([{name: replies[k][0][c]} for k in holders], weights,
                                     among=holders) if holders else {}
        if merged:
            out[c], present[c] = merged[name], True
    return out, present
