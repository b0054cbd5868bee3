"""DP-FedAvg's server half (driftfl.common.privacy has the mechanism): the round's update is the
plain mean of the accepted clients' updates over the m clients sent a train message, clipped
by the server (central) or by each client (distributed), noised by the server (central) or
already by the clients (distributed); epsilon is what dp-accounting composes over the rounds.

Why not Flower's DifferentialPrivacyServerSideFixedClipping / ClientSideFixedClipping: they
wrap a strategy object, so the driftfl strategy inside would lose its interface (its reply
checks, its report, its state for checkpoints); they clip before driftfl's reply checks
would run; they average by example count, where a client's weight would be its own
sensitivity; and they cover the model's arrays only. Flower's clipping primitive and
dp-accounting are reused; the glue is here.

A method's payload that the server takes as a sum (SCAFFOLD's control deltas, FedCurv's
changes of Fisher terms, the class prototypes of FedProto and FedCSD) is the round's second
Gaussian release: each client's term is clipped to privacy.payload_clip C_p (by the server, or
by the client) and the sum gets noise sigma C_p; the accountant composes the two inside the
sampled round (``parts``).
"""

from __future__ import annotations

import math
import secrets

import numpy as np

from driftfl.common.accounting import subsampled_gaussian_epsilon
from driftfl.common.privacy import PrivacySettings, add_noise, clip_update, float_keys

from .aggregation import ClientUpdate, model_norm

# a client's noise share of std s over d coordinates has norm at most s (sqrt(d) + TAIL)
# but with probability exp(-TAIL^2 / 2) (Gaussian concentration): an honest reply never
# meets the bound
TAIL = 10.0
# the float32 model the client sends rounds each coordinate by at most 2^-24 of it: its update's
# norm may exceed the clip by that much of the model's norm (without noise, nothing else covers it)
ROUNDING = 1e-7


class PrivateMean:
    """The DP mean of a round's updates, and the privacy spent.

    ``per_round``: the clients a round selects out of ``num_clients`` (the sampling rate the
    accountant amplifies by). The noise seed is drawn from the OS, never from the
    experiment's seed: whoever holds the run's config must not be able to subtract the
    noise; a checkpoint keeps it, so a resumed run adds the same noise."""

    def __init__(self, settings: PrivacySettings, *, num_clients: int, per_round: int,
                 payload: str = ""):
        self.settings = settings
        self.num_clients = num_clients
        self.per_round = per_round
        self.payload = payload  # what the method's payload is, in words ("": none)
        self.noise_seed = secrets.randbits(62)

    @property
    def parts(self) -> int:
        """The Gaussian sums a round releases: the update, and the payload's if any."""
        return 2 if self.payload else 1

    @property
    def sample_rate(self) -> float:
        return min(1.0, self.per_round / self.num_clients)

    def epsilon(self, rounds: int) -> float:
        """Epsilon at the settings' delta after ``rounds`` rounds (inf without noise)."""
        if rounds == 0:
            return 0.0
        if self.settings.noise_multiplier == 0:
            return math.inf
        return subsampled_gaussian_epsilon(self.sample_rate, self.settings.noise_multiplier,
                                           rounds, self.settings.delta, self.parts)

    def plan(self, rounds: int, secure_sum: bool) -> str:
        """What the run will do and spend, for the line a run prints before its rounds."""
        s = self.settings
        who = ("the server clips each client's update" if s.name == "central"
               else "each client clips its own update")
        line = (f"privacy: DP-FedAvg ({s.name}): {who} to {s.clip:g}, and the mean "
                f"of the {self.per_round} of {self.num_clients} clients a round selects gets "
                f"noise {s.noise_multiplier:g} x {s.clip:g} / {self.per_round}; epsilon after "
                f"{rounds} rounds at delta {s.delta:g}: {self.epsilon(rounds):.3g}")
        if s.target_epsilon is not None:
            line += f" (the run stops before passing {s.target_epsilon:g})"
        if self.payload:
            line += (f"\nprivacy: {self.payload} clipped to privacy.payload_clip="
                     f"{s.payload_clip:g} per client, their sum noised by "
                     f"{s.noise_multiplier:g} x {s.payload_clip:g}; epsilon composes both sums")
        if s.name == "distributed" and not secure_sum:
            line += (f"\nprivacy: without secure aggregation the server sees each client's "
                     f"update with only its share of the noise (std "
                     f"{s.share_noise_std(self.per_round):.3g}, not "
                     f"{s.noise_multiplier * s.clip:.3g}); secagg=secaggplus hides all but the sum")
        return line

    def over_budget(self, server_round: int) -> str | None:
        """Why round ``server_round`` must not run (None: it may): it would take epsilon past
        privacy.target_epsilon."""
        target = self.settings.target_epsilon
        if target is None or self.epsilon(server_round) <= target:
            return None
        return (f"round {server_round} would spend epsilon {self.epsilon(server_round):.3g} "
                f"at delta {self.settings.delta:g}, past privacy.target_epsilon={target:g}; "
                f"the run stops after round {server_round - 1} (epsilon "
                f"{self.epsilon(server_round - 1):.3g})")

    def reply_bound(self, dimension: int, clients: int) -> float:
        """The largest update norm an honest client sends: its clip, plus (distributed) the
        norm its noise share reaches but with negligible probability."""
        if self.settings.name != "distributed":
            return math.inf  # central: the server clips whatever comes
        share = self.settings.share_noise_std(clients)
        return self.settings.clip + share * (math.sqrt(dimension) + TAIL)

    def aggregate_bound(self, dimension: int, clients: int) -> float:
        """The largest norm the round's DP mean update reaches: every clipped update, plus the
        norm its noise reaches but with negligible probability."""
        return self.settings.clip + self.settings.mean_noise_std(clients) * (
            math.sqrt(dimension) + TAIL)

    def payload_sum_bound(self, dimension: int, clients: int) -> float:
        """The largest norm the round's noised payload sum reaches: every clipped term, plus
        its noise but with negligible probability."""
        s = self.settings
        return s.payload_clip * (clients + s.noise_multiplier * (math.sqrt(dimension) + TAIL))

    def reject_payload(self, terms: list[np.ndarray], clients: int) -> str | None:
        """Why a reply's payload exceeds what privacy=distributed lets a client send (None:
        it does not, or the server clips it: central)."""
        if self.settings.name != "distributed":
            return None
        clip = self.settings.payload_clip
        norm = model_norm(dict(enumerate(terms)))
        bound = (1 + ROUNDING) * clip + self.settings.share_noise_std(clients, clip) * (
            math.sqrt(sum(t.size for t in terms)) + TAIL)
        if norm > bound:
            return (f"its payload's norm {norm:.4g} exceeds what privacy=distributed lets a "
                    f"client send ({bound:.4g}: payload_clip {clip:g} plus its noise)")
        return None

    def sum_payload(self, terms: list[list[np.ndarray]], shapes: list[tuple[int, ...]],
                    server_round: int) -> list[np.ndarray]:
        """The round's payload sum: each client's term clipped to payload_clip, summed, noised
        by sigma payload_clip (central); the clients' clipped and noised terms summed
        (distributed). A client not heard from adds nothing."""
        total = [np.zeros(shape, np.float64) for shape in shapes]
        central = self.settings.name == "central"
        for term in terms:
            term = [np.asarray(t, np.float64) for t in term]
            if central:
                clip_update(term, self.settings.payload_clip, in_place=True)
            for t, d in zip(total, term, strict=True):
                t += d
        if central:  # a stream apart from the update's noise
            rng = np.random.default_rng([self.noise_seed, server_round, 1])
            total = add_noise(total, self.settings.noise_multiplier * self.settings.payload_clip,
                              rng)
        return total

    def reject(self, update: ClientUpdate, global_arrays: dict[str, np.ndarray],
               clients: int) -> str | None:
        if not update.arrays:  # a masked reply (secure aggregation): its client clipped it
            return None
        keys = float_keys(global_arrays)
        delta = [update.arrays[k] - global_arrays[k] for k in keys]
        norm = float(np.sqrt(sum(float(np.sum(np.square(d, dtype=np.float64))) for d in delta)))
        bound = (self.reply_bound(sum(d.size for d in delta), clients)
                 + ROUNDING * model_norm(global_arrays))
        if norm > bound:
            return (f"its update's norm {norm:.4g} exceeds what privacy=distributed lets a "
                    f"client send ({bound:.4g}: clip {self.settings.clip:g} plus its noise)")
        return None

    def combine(self, updates: list[ClientUpdate], global_arrays: dict[str, np.ndarray],
                clients: int, server_round: int) -> dict[str, np.ndarray]:
        """global + (sum of the clipped updates) / ``clients`` + noise (central); the clients
        not heard from count as a zero update, so one client moves the mean by at most C / m."""
        keys = float_keys(global_arrays)
        total = [np.zeros(global_arrays[k].shape, np.float64) for k in keys]
        for update in updates:
            delta = [update.arrays[k] - global_arrays[k] for k in keys]
            if self.settings.name == "central":
                clip_update(delta, self.settings.clip, in_place=True)
            for t, d in zip(total, delta):
                t += d
        mean = [t / clients for t in total]
        if self.settings.name == "central":
            rng = np.random.default_rng([self.noise_seed, server_round])
            mean = add_noise(mean, self.settings.mean_noise_std(clients), rng)
        out = dict(global_arrays)
        for key, value in zip(keys, mean):
            out[key] = (global_arrays[key] + value).astype(global_arrays[key].dtype)
        return out

