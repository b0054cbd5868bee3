"""What one reply may do to the server's state, measured against its peers and the state itself.

The reply checks (``aggregation.check_reply``) bound each reply alone; a hostile client inside
those bounds can still send a payload many times larger than any honest client's. These rules
close that, for the model update and for every payload that feeds strategy state (SCAFFOLD's
Delta c, FedCurv's Fisher, prototypes, DCFL's pre-trained model):

- **Peers.** A payload's norm may be at most ``max_peer_ratio`` times the round's *lower*
  median of the same payload's nonzero norms (the smaller middle value; a copied model sets no
  bar), so while most replies are honest, one reply cannot outweigh them by size. Fewer than
  ``MIN_HOLDERS`` (3) nonzero norms set no bar (``peer_bar``): with two, the smaller one would
  be the bar, and a client that shrinks its own payload would get its one peer rejected.
- **State.** A new state replaces the old only when it is finite and has moved by at most
  ``max_update_ratio`` times the smaller of max(1, the old state's norm) and the round's honest
  scale (``move_scale``: what the median client alone would move it by); otherwise the old state
  stays and the refusal is logged and recorded like a rejected reply (``refused_state``).
- **Weight.** In deployment, where nodes claim their example counts, a reply weighs as at most
  ``max_examples_ratio`` times the lower median of the data survey's counts (``capped``).
- **Repeat offenders.** A client whose reply failed a check of that reply alone (not a peer
  bar) ``exclude_after`` rounds in a row, while most of each round's replies were used, is
  excluded from the rest of the run (``count_offences``); never under differential privacy.

Screens against peers run only where the round's release allows clients to be compared (never
under differential privacy: release/). Where clients are not trusted, the replies that pass are
then bounded by the aggregation (bounded.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from logging import WARNING

import numpy as np
from flwr.supercore import log

from driftfl.common.error_replies import log_refused, resource_of
from driftfl.common.protocol import NUM_EXAMPLES

from driftfl.strategies.parts.aggregation import ClientUpdate, model_norm, update_norm
from driftfl.strategies.parts.clients import KnownClients


def lower_median(values: Sequence[float]) -> float:
    """The smaller middle value of the finite ``values``: the median for an odd count, the
    lower of the two otherwise (NaN when none is finite)."""
    ordered = sorted(v for v in values if math.isfinite(v))
    return ordered[(len(ordered) - 1) // 2] if ordered else math.nan


def nonzero_lower_median(values: Sequence[float]) -> float:
    """The lower median of the ``values`` above 0 (0 when none is): a reply of size 0 (all
    zeros) is never outsized itself, and must not pull the bar its peers meet down to 0."""
    positive = [v for v in values if v > 0]
    return lower_median(positive) if positive else 0.0


# the fewest nonzero norms that set a peer bar: with two, the smaller alone would be the bar
MIN_HOLDERS = 3


def peer_bar(values: Sequence[float]) -> float:
    """The bar ``values`` set for each other: their ``nonzero_lower_median`` where at least
    ``MIN_HOLDERS`` are finite and above 0, else inf (no bar). With three or more, one client
    cannot be the lower median unless it lies between two others; with two, a client sending
    a tiny payload would make its one peer "outsized"."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    return lower_median(positive) if len(positive) >= MIN_HOLDERS else math.inf


def peer_outliers(norms: Sequence[float], ratio: float) -> tuple[list[int], float]:
    """(positions whose norm exceeds ``ratio`` x the ``peer_bar`` of ``norms``, that bound)."""
    bound = ratio * peer_bar(norms)  # a copied model (0) sets no bar
    return [i for i, n in enumerate(norms) if not n <= bound], bound


def state_problem(new: Mapping[str, np.ndarray], old: Mapping[str, np.ndarray] | None,
                  ratio: float, floor: float = 0.0, scale: float | None = None) -> str | None:
    """Why ``new`` must not replace ``old`` (None: it may): a value not finite, or a move of more
    than ``ratio`` x max(1, ||old||) (from zero when there is no old state yet) or, tighter,
    than ``ratio`` x ``scale``: the honest scale of one round's move, the lower median of what
    the round's clients each contribute to it, so that a state starting at zero moves as far as
    its clients do, not by ``ratio`` at once; or than ``floor`` where that is larger (what
    differential privacy's noise may add)."""
    for key, value in new.items():
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return f"'{key}' would hold NaN or infinite values"
    base = old if old is not None else {k: np.zeros_like(v) for k, v in new.items()}
    reference = max(1.0, model_norm(base))
    honest = scale is not None and scale < reference
    moved, bound = update_norm(new, base), max(ratio * (scale if honest else reference), floor)
    if not moved <= bound:
        what = " x the round's median contribution" if honest else ""
        return f"it would move by {moved:.3g}, over the bound {bound:.3g} (max_update_ratio{what})"
    return None


def move_scale(moves: Sequence[float], weight: float = 1.0) -> float | None:
    """The honest scale of a state's move in a round: ``weight`` (the share of the clients the
    method's formula counts, |S| / K, or their number for a sum) x the lower median of what each
    client would move it by alone (None: no client contributed)."""
    median = lower_median(moves)
    return None if math.isnan(median) else weight * median


class ReplyGuard:
    """These rules as a strategy applies them: a part of every strategy (``DriftStrategy.guard``),
    with the bounds the experiment sets and the ``clients`` whose replies it names and caps."""

    def __init__(self, *, max_peer_ratio: float, max_update_ratio: float,
                 max_examples_ratio: float, clients: KnownClients,
                 exclude_after: int = 0) -> None:
        self.max_peer_ratio = max_peer_ratio
        self.max_update_ratio = max_update_ratio
        self.max_examples_ratio = max_examples_ratio
        self.clients = clients
        # a client rejected this many rounds in a row is excluded for the rest of the run
        self.exclude_after = exclude_after
        self.strikes: dict[str, int] = {}  # client name -> rounds in a row it was rejected

    def refuse_reply(self, report, node: int, reason: str, *, by_peers: bool = False,
                     logged: bool = False) -> None:
        """Log and record (in the round's ``report``) that a node's reply is not used; one that
        failed for want of a resource is logged with the round's others (``log_starved``).
        ``by_peers``: a peer bar refused it, evidence made of other clients' replies, which
        ``count_offences`` does not count against it; ``logged``: its line was logged when it
        came (an exchange before training: FedCSD's prototype phase)."""
        report.rejected.append(f"{self.clients.describe(node)}: {reason}")
        report.rejected_partitions.append(self.clients.name(node))
        if resource := resource_of(reason):
            if not logged:
                report.starved.append((self.clients.describe(node), reason))
            report.failed.append((self.clients.name(node), resource.name))
        else:
            (report.outsized if by_peers else report.offenders).append(node)
            if not logged:
                log(WARNING, "round reply from %s rejected: %s", self.clients.describe(node),
                    reason)

    def superlink_failed(self, report, node: int, reason: str) -> None:
        """Log and record that the SuperLink failed the node's message (round_report's
        ``superlink_failures``): not used, named as what it is, no offence of the node's."""
        report.rejected.append(f"{self.clients.describe(node)}: {reason}")
        report.rejected_partitions.append(self.clients.name(node))
        report.failed.append((self.clients.name(node), reason))
        log(WARNING, "round reply from %s failed: %s", self.clients.describe(node), reason)

    @staticmethod
    def log_starved(report) -> None:
        """One line for the round's replies that failed for want of a resource."""
        log_refused("round", report.starved)

    def peer_screen(self, report, updates: list[ClientUpdate], what: str,
                    size: Callable[[ClientUpdate], float], power: int = 1
                    ) -> list[ClientUpdate]:
        """The updates whose ``what`` (its norm, ``size``) is within ``max_peer_ratio`` (to the
        ``power``: 2 for a payload quadratic in the gradients) x the round's lower median of the
        same; the others are rejected like a failed check."""
        sizes = [size(u) for u in updates]
        ratio = self.max_peer_ratio ** power
        outliers, bound = peer_outliers(sizes, ratio)
        for i in outliers:
            self.refuse_reply(
                report, updates[i].node_id,
                f"its {what}'s norm {sizes[i]:.3g} is over {self.ratio_text(power)}"
                f" x the round's median {bound / ratio:.3g}" if math.isfinite(sizes[i])
                else f"its {what}'s norm is not finite", by_peers=math.isfinite(sizes[i]))
        return [u for i, u in enumerate(updates) if i not in outliers]

    def ratio_text(self, power: int = 1) -> str:
        return f"max_peer_ratio={self.max_peer_ratio:g}" + (f"^{power}" if power != 1 else "")

    def refuse_state(self, report, server_round: int, what: str, reason: str) -> None:
        """Log and record that ``what`` (a piece of strategy state) keeps its old value."""
        log(WARNING, "round %d: the update of %s refused: %s; it stays as it was", server_round,
            what, reason)
        report.refused_state.append(f"{what}: {reason}")

    def state_problem(self, new: dict[str, np.ndarray],
                      old: dict[str, np.ndarray] | None, floor: float = 0.0,
                      scale: float | None = None) -> str | None:
        """Why a new strategy state must not replace ``old`` (guard.state_problem)."""
        return state_problem(new, old, self.max_update_ratio, floor, scale)

    def count_offences(self, report, answered: set[int], compares_clients: bool = True) -> None:
        """After a round's replies are checked: a client whose reply failed a check of that
        reply alone (not for want of a resource), while most of the round's replies were used,
        has one more round in a row against it; one that replied and was used, none; at
        ``exclude_after`` it is excluded from the rest of the run, named once.

        A rejection by a peer bar (``report.outsized``) neither counts nor clears a streak: its
        evidence is other clients' replies, which a client can shape (a tiny payload lowers the
        bar its peers meet), and exclusion is for good while a rejected reply is never used
        anyway: a wrong exclusion costs an honest client, a missed one only the work of
        rejecting the reply each round. A round that rejects half its replies or more counts
        against nobody: its model, not its clients, is then the likely cause (honest clients
        whose model another client broke must not be blamed for it).

        Where the release may not compare clients (``compares_clients`` False: differential
        privacy) nobody is excluded: that half-the-round rule compares them, and without it a
        model that diverged would exclude every honest client on its own reply alone."""
        if not self.exclude_after or not compares_clients:
            return
        rejected = len(report.offenders) + len(report.outsized)
        outliers = set(report.offenders) if 2 * rejected < len(answered) else set()
        for node in answered:
            name = self.clients.name(node)
            if node in report.outsized and node not in outliers:
                continue  # no evidence of its own either way
            if node not in outliers:
                self.strikes.pop(name, None)
                continue
            self.strikes[name] = self.strikes.get(name, 0) + 1
            if self.strikes[name] >= self.exclude_after and self.clients.exclude(node):
                log(WARNING, "%s excluded from the rest of the run: its replies were rejected "
                    "%d rounds in a row (exclude_after=%d)", self.clients.describe(node),
                    self.strikes[name], self.exclude_after)

    def weight_cap(self) -> float:
        """The most examples a reply weighs as: max_examples_ratio x the *lower* median of the
        data survey's counts, as the peer screen (with two nodes the smaller count: the mean
        would let one node claiming 1e8 keep 99.999 % of the weight); inf before a survey or
        without a cap."""
        surveyed = self.clients.surveyed
        if not surveyed or math.isinf(self.max_examples_ratio):
            return math.inf
        return self.max_examples_ratio * lower_median(list(surveyed.values()))

    def capped(self, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        """The updates with num-examples at most ``weight_cap``: every weight (FedAvg's,
        FedNova's, FedDisco's, Krum's, the metrics' means) is formed from it."""
        cap, out = self.weight_cap(), []
        for update in updates:
            if update.num_examples > cap:
                log(WARNING, "round reply from %s weighs as %.12g examples, not its %.12g "
                    "(max_examples_ratio=%g x the survey's lower median count)",
                    self.clients.describe(update.node_id), cap, update.num_examples,
                    self.max_examples_ratio)
                update = replace(update, metrics={**update.metrics, NUM_EXAMPLES: cap})
            out.append(update)
        return out
