"""The release part of a round: which checked replies enter what the server makes of them, and
how (clipping, noise, the accountant). Chosen once from config (``privacy=``, ``secagg=``):

| release | the server sees | which replies enter | the update the round releases | accounted |
|---|---|---|---|---|
| plain | each reply | those that pass every check, peer screens included | the aggregation's | - |
| secure sum | only the masked replies' sum | those whose clear metrics pass | their example-weighted mean | - |
| central DP | each reply (it is trusted) | those that pass the per-client checks | (sum of clipped updates + N(0, sigma^2 C^2)) / qN | Poisson at q, sigma |
| distributed DP | each noised share, or with secagg their sum | per-client checks; m_min shares at least | sum of the m' shares / m' | q = 1: sigma sqrt(m'/m_min) (secagg), sigma / sqrt(m_min) per share (without) |

Under DP no check compares clients with each other (one client's data would decide whether
another's reply counts), and noise is added in every round, also when no reply is accepted.

A method declares its summed payload once (``payload_record``, ``payload()``); a release that
sums payloads reads, bounds and sums it beside the update, and the method takes the sum. A
method never reads the privacy mode: it relies on what the release declares here
(``compares_clients``, ``raw_payloads``, ``sums_payloads``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from driftfl.common.accounting import released_epsilon, round_of
from driftfl.common.privacy import PrivacySettings, add_noise, clip_update, float_keys

from driftfl.strategies.parts.aggregation import ClientUpdate

# a noise share of std s over d coordinates has norm at most s (sqrt(d) + TAIL) but with
# probability exp(-TAIL^2 / 2) (Gaussian concentration): an honest reply never meets the bound
TAIL = 10.0
# the float32 model the client sends rounds each coordinate by at most 2^-24 of it: its update's
# norm may exceed the clip by that much of the model's norm
ROUNDING = 1e-7


@dataclass(frozen=True)
class RoundFacts:
    """What the release needs to know of a round, from the strategy."""

    global_arrays: dict[str, np.ndarray]  # the model sent this round
    sent: list[int]  # the nodes sent its train message
    payload: dict[str, tuple[int, ...]]  # the method's summed payload: array -> shape ({}: none)
    payload_record: str  # the reply record that holds it
    population: list[int]  # every node the data survey accepted

    @property
    def dimension(self) -> int:
        return sum(v.size for v in self.global_arrays.values() if v.dtype.kind == "f")

    @property
    def payload_size(self) -> int:
        return sum(math.prod(shape) for shape in self.payload.values())


@dataclass
class SecureSum:
    """What a SecAgg+ round hands on (driftfl.server.secure): the replies whose clear metrics
    passed, arrays-free, and the unmasked mean of their masked vectors."""

    updates: list[ClientUpdate]  # in node order: the replies summed
    rejected: dict[int, str]  # node -> why its reply was left out of the sum
    answered: set[int]  # every node whose collect-stage reply arrived
    mean_update: list[np.ndarray] | None  # the float arrays' weighted mean; None: no sum
    payload_sum: dict[str, np.ndarray] | None = None
    halted: str = ""  # why no sum was released
    # the server unmasked the sum (and so has seen it) even though it releases nothing: a
    # sum that failed the range check after the unmask stage
    unmasked: bool = False


@dataclass
class Released:
    """What the release hands the aggregation and the method."""

    updates: list[ClientUpdate]  # the replies that entered
    # a protected release: the round's update (the float arrays, in the model's order), which
    # the mean aggregation applies; None: the aggregation works on the updates themselves
    mean_update: list[np.ndarray] | None = None
    payload_sum: dict[str, np.ndarray] | None = None  # the summed payload, where it is summed
    # the payload's public denominators: the nodes whose terms the sum may hold, and the share
    # of them it holds in expectation (central: its Poisson rate)
    holders: list[int] = field(default_factory=list)
    holder_share: float = 1.0
    withheld: str = ""  # why nothing was released this round ("": released)


def read_terms(update: ClientUpdate, facts: RoundFacts) -> list[np.ndarray] | str:
    """The reply's payload terms in ``facts.payload``'s order, or why they cannot be used: the
    record with each array of its shape, floating and finite."""
    record = update.message.content.array_records.get(facts.payload_record)
    if record is None:
        return f"reply lacks the '{facts.payload_record}' record"
    terms = []
    for name, shape in facts.payload.items():
        try:
            value = record[name].numpy()
        except Exception as err:  # missing or unreadable bytes
            return f"'{facts.payload_record}' array '{name}' cannot be read: {err!r}"
        if value.shape != tuple(shape) or value.dtype.kind != "f" or not np.isfinite(value).all():
            return (f"'{facts.payload_record}' array '{name}' is not {list(shape)} finite "
                    "floats")
        terms.append(value.astype(np.float64))
    return terms


def summed(parts: list[list[np.ndarray]], shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """The element-wise sum of lists of arrays (zeros of ``shapes`` when there are none)."""
    total = [np.zeros(shape, np.float64) for shape in shapes]
    for part in parts:
        for t, p in zip(total, part, strict=True):
            t += p
    return total


def deltas(update: ClientUpdate, facts: RoundFacts) -> list[np.ndarray]:
    """The reply's update w_k - w of the float arrays, float64, in the model's order."""
    return [update.arrays[k].astype(np.float64) - facts.global_arrays[k]
            for k in float_keys(facts.global_arrays)]


class Release:
    """plain (and, ``secure``, the secure sum of SecAgg+): the server uses what it receives as
    it is; nothing is noised or accounted."""

    name = "plain"
    compares_clients = True  # the guard may screen a reply against the round's other replies
    weighs_examples = True  # replies weigh by their example counts

    def __init__(self, *, secure: bool = False) -> None:
        self.secure = secure  # the server sees only the sum (SecAgg+)

    @property
    def raw_payloads(self) -> bool:
        """Whether the server reads each reply's payload as its client computed it."""
        return not self.secure

    @property
    def sums_payloads(self) -> bool:
        """Whether the method takes its payload as the round's sum (``payload_sum``)."""
        return self.secure

    def sample(self, nodes: list[int], choose) -> list[int]:
        """The round's clients among the available ``nodes``: the selection's
        (``choose(nodes)``)."""
        return choose(nodes)

    def admit(self, update: ClientUpdate, facts: RoundFacts) -> str | None:
        """The release's own check of one reply, before it may enter (None: it may)."""
        return None

    def release(self, server_round: int, facts: RoundFacts, updates: list[ClientUpdate],
                secure: SecureSum | None = None) -> Released:
        if secure is None:
            return Released(updates, holders=[u.node_id for u in updates])
        if secure.mean_update is None:
            return Released(updates, withheld=secure.halted)
        return Released(updates, mean_update=secure.mean_update, payload_sum=secure.payload_sum,
                        holders=[u.node_id for u in updates])

    def enough(self, summed_count: int) -> bool:
        """Whether a secure round may unmask a sum of this many masked vectors."""
        return True

    def reply_bound(self, facts: RoundFacts) -> float:
        """How far a reply may move from the global model for the release's own reasons (its
        noise), beyond max_update_ratio's bound; 0: nothing beyond."""
        return 0.0

    def aggregate_bound(self, facts: RoundFacts) -> float:
        """Likewise for the round's released update."""
        return 0.0

    def sum_bound(self, facts: RoundFacts) -> float:
        """How far the round's payload sum may reach by the release's own doing (its clipped
        terms and its noise), which a state made of it may move by; 0: nothing."""
        return 0.0

    def coordinate_reach(self, facts: RoundFacts) -> float:
        """How far one coordinate of one client's masked vector reaches when the client follows
        the release (secagg.clipping_range=auto): 0 where the release does not bound it."""
        return 0.0

    def columns(self, server_round: int) -> dict[str, float]:
        """The round's privacy columns for metrics.csv (none without DP)."""
        return {}

    def charge(self, server_round: int) -> None:
        """Charge round ``server_round`` as its messages go out (nothing without DP)."""

    def settle(self) -> None:
        """After a round: a charge its release did not replace stays charged."""

    def charged(self) -> list[dict]:
        """Every release charged so far, one dict each (none without DP)."""
        return []

    def stop_before(self, server_round: int) -> str | None:
        """Why round ``server_round`` must not run (None: it may)."""
        return None

    @property
    def label(self) -> str:
        """The protection in a few words, for the round line and accuracy.png ("": none)."""
        return "secagg+" if self.secure else ""

    def swamped(self, dimension: int) -> str:
        """A warning line before round 1 when the noise outweighs the clients' updates ("":
        none), for a model of ``dimension`` float coordinates."""
        return ""

    def plan(self, rounds: int) -> str:
        """The lines a run prints before round 1 ("": none)."""
        if self.secure:
            return ("secure aggregation: SecAgg+ (Flower's): the server sees only the sum of "
                    "the round's masked replies, never one client's update")
        return ""

    def summary(self) -> dict:
        """What summary.json records of the release."""
        return {}


class PrivateRelease(Release):
    """What central and distributed DP share: the clip norms, the noise multiplier, the
    ledger of what every round released (``spent``) and the accountant over it."""

    compares_clients = False
    weighs_examples = False  # every client counts once: a weight would be its own sensitivity

    def __init__(self, settings: PrivacySettings, *, num_clients: int, per_round: int,
                 payload: str = "", secure: bool = False) -> None:
        super().__init__(secure=secure)
        self.settings = settings
        self.num_clients = num_clients
        self.per_round = per_round  # the clients a round selects when every node is up
        self.payload = payload  # what the method's payload is, in words ("": none)
        # per round released: [round, the sampling rate credited, the noise multipliers of
        # its Gaussian sums (the update's, the payload's, ...)]
        self.spent: list[list[float]] = []
        # releases of rounds that a stopped run sent again after its resume, as ``spent``: the
        # first sending's clients drew fresh noise and replied, and the server may have seen it
        self.lost: list[list[float]] = []
        # the round going out, charged at its worst until its release replaces it (``charge``)
        self.pending: list[float] | None = None
        # per round released: what says why the run learns or not (``diagnose``)
        self.diagnostics: dict[int, dict[str, float]] = {}

    @property
    def label(self) -> str:
        return f"DP {self.name}" + (", secagg+" if self.secure else "")

    @property
    def expected(self) -> float:
        """m: the clients a round selects (central: q N, its sample's expected size)."""
        return self.per_round

    def round_noise(self, clients: float) -> float:
        """The noise's std per coordinate of the mean update of a round that selects
        ``clients`` (m), every reply arriving."""
        raise NotImplementedError

    def noise_words(self, clients: float) -> str:
        """How ``round_noise(clients)`` is made, in words."""
        raise NotImplementedError

    def needed(self, dimension: int) -> int:
        """The fewest clients a round needs for its noise per coordinate to be at most
        C / sqrt(d) (``round_noise`` falls as m grows)."""
        def enough(clients: int) -> bool:
            return self.round_noise(clients) <= self.settings.clip / math.sqrt(dimension)

        low, high = 1, 2
        while not enough(high):
            low, high = high, 2 * high
        while low < high:  # the first m that is enough
            mid = (low + high) // 2
            low, high = (low, mid) if enough(mid) else (mid + 1, high)
        return high

    def swamped(self, dimension: int) -> str:
        """The mean of m updates clipped to C has norm at most C: C / sqrt(d) per coordinate,
        spread evenly over the model's d coordinates. A noise std per coordinate above that
        (its norm, std sqrt(d), above C) outweighs even clients whose updates all point one
        way. Said from the settings and the model's size alone, nothing of the clients'
        data."""
        m, clip = self.expected, self.settings.clip
        std, typical = self.round_noise(m), clip / math.sqrt(dimension)
        if std <= typical:
            return ""
        return (f"privacy: warning: the noise per coordinate of a round's update, "
                f"{self.noise_words(m)} = {std:.3g}, exceeds a clipped update spread over the "
                f"model's d = {dimension} coordinates, C / sqrt(d) = {typical:.3g}: the noise "
                f"outweighs the clients' updates and the model may not learn; it needs "
                f"m >= {self.needed(dimension)} clients a round (now {m:g}), a smaller model or "
                "less noise")

    def diagnose(self, server_round: int, mean_update: list[np.ndarray], noise_std: float,
                 norms: list[float] | None = None, clip: float = 0.0) -> None:
        """Keep the round's figures for ``columns``: the released mean update's norm
        (``dp_update_norm``: post-processing of the release, covered by epsilon) beside the
        norm its noise of std ``noise_std`` per coordinate has alone (``dp_noise_norm``: from
        the settings and the count of replies, public); with ``norms``, the replies' update
        norms before the clip as the trusted server saw them (central), their median and the
        share over ``clip`` (exact: not covered by epsilon)."""
        dimension = sum(a.size for a in mean_update)
        figures = {"dp_update_norm": math.sqrt(sum(float(np.sum(np.square(a)))
                                                   for a in mean_update)),
                   "dp_noise_norm": noise_std * math.sqrt(dimension)}
        if norms is not None:
            figures["dp_median_norm"] = float(np.median(norms)) if norms else math.nan
            figures["dp_clipped_share"] = (sum(n > clip for n in norms) / len(norms)
                                           if norms else math.nan)
        self.diagnostics[server_round] = figures

    @property
    def sums_payloads(self) -> bool:
        return True

    def rounds(self, upto: int) -> tuple:
        return tuple(round_of(entry[1], entry[2:]) for entry in self.spent + self.lost
                     if entry[0] <= upto)

    def epsilon(self, upto: int) -> float:
        """Epsilon at delta of every round released up to round ``upto``."""
        return released_epsilon(self.rounds(upto), self.settings.delta)

    def noise(self, server_round: int, arrays: list[np.ndarray], std: float
              ) -> list[np.ndarray]:
        """``arrays`` plus N(0, std^2) per coordinate, from the operating system's entropy (an
        audit's broken mechanism overrides this, and nothing else)."""
        return add_noise(arrays, std)

    def spend(self, server_round: int, rate: float, *sigmas: float) -> None:
        """Record what round ``server_round`` released (its charge at send is replaced)."""
        self.pending = None
        self.spent.append([float(server_round), float(rate), *map(float, sigmas)])

    def charge(self, server_round: int) -> None:
        """Charge the round at its worst (``planned``) as its messages go out: the clients
        noise afresh and reply whether or not the run lives to record the release, so a run
        stopped before its checkpoint has released the round once more than the checkpoint
        says (server/ledger.py keeps this charge on disk until the round is recorded)."""
        rate, sigmas = self.planned()
        self.pending = [float(server_round), float(rate), *map(float, sigmas)]

    def settle(self) -> None:
        if self.pending is not None:  # the round ended without a release: charged as sent
            self.spent.append(self.pending)
            self.pending = None

    def charged(self) -> list[dict]:
        """Every release charged so far (the ledger's entries): the recorded ones, those of
        rounds sent again after a stop, and the round going out."""
        names = ["dp_sigma", *self.stream_names]

        def entry(e: list[float], outcome: str) -> dict:
            if outcome == "released" and not any(map(math.isfinite, e[2:])):
                outcome = "nothing released"
            return {"round": int(e[0]), "q": e[1], "sigmas": dict(zip(names, e[2:])),
                    "outcome": outcome}

        return sorted([entry(e, "released") for e in self.spent]
                      + [entry(e, "sent again after a stop") for e in self.lost]
                      + ([entry(self.pending, "going out")] if self.pending else []),
                      key=lambda e: e["round"])

    def planned(self) -> tuple[float, tuple[float, ...]]:
        """The rate and multipliers of a round at its worst, for predictions."""
        raise NotImplementedError

    def projected(self, rounds: int, after: int = 0) -> float:
        """Epsilon after ``rounds`` more rounds at their worst, following round ``after``."""
        return released_epsilon(self.rounds(after) + (round_of(*self.planned()),) * rounds,
                                self.settings.delta)

    def stop_before(self, server_round: int) -> str | None:
        target = self.settings.target_epsilon
        if target is None:
            return None
        spent, next_round = self.epsilon(server_round - 1), self.projected(1, server_round - 1)
        if next_round <= target:
            return None
        return (f"round {server_round} would spend epsilon {next_round:.3g} at delta "
                f"{self.settings.delta:g}, past privacy.target_epsilon={target:g}; the run "
                f"stops after round {server_round - 1} (epsilon {spent:.3g})")

    def columns(self, server_round: int) -> dict[str, float]:
        entry = next((e for e in reversed(self.spent) if e[0] == server_round), None)
        out = {"epsilon": self.epsilon(server_round)}
        if entry is not None:
            out.update({"dp_q": entry[1], "dp_sigma": entry[2]})
            out.update(dict(zip(self.stream_names, entry[3:])))
            # more than 1: the round was sent again after a stop, each sending charged
            out["dp_releases"] = sum(e[0] == server_round for e in self.spent + self.lost)
        out.update(self.diagnostics.get(server_round, {}))
        return out

    @property
    def stream_names(self) -> list[str]:
        """The columns of the round's further Gaussian sums, after the update's."""
        return ["dp_sigma_payload"] if self.payload else []

    def summary(self) -> dict:
        rounds = int(max((e[0] for e in self.spent), default=0))
        epsilon = self.epsilon(rounds)
        last = max(self.diagnostics, default=None)
        return {"epsilon": epsilon if math.isfinite(epsilon) else None,
                "delta": self.settings.delta,
                **({"dp_last_round": {"round": last, **self.diagnostics[last]}}
                   if last is not None else {})}

    def budget_words(self) -> str:
        target = self.settings.target_epsilon
        return f" (the run stops before passing {target:g})" if target is not None else ""

    def payload_line(self, share_words: str) -> str:
        if not self.payload:
            return ""
        s = self.settings
        return (f"\nprivacy: {self.payload} clipped to privacy.payload_clip={s.payload_clip:g} "
                f"per client and summed with noise {s.noise_multiplier:g} x "
                f"{s.payload_clip:g}{share_words}; epsilon composes both sums")

    def payload_terms(self, updates: list[ClientUpdate], facts: RoundFacts,
                      clip: float | None) -> dict[str, np.ndarray] | None:
        """The accepted replies' payload terms, each clipped to ``clip`` (None: as sent),
        summed; None when the method sends none."""
        if not facts.payload:
            return None
        parts = []
        for update in updates:
            terms = read_terms(update, facts)  # admitted: they read
            if clip is not None:
                clip_update(terms, clip, in_place=True)
            parts.append(terms)
        return dict(zip(facts.payload, summed(parts, list(facts.payload.values()))))
