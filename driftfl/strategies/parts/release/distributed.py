"""privacy=distributed: DP-FedAvg with the noise added by the clients (see base.py)."""

from __future__ import annotations

import math
from logging import WARNING

from flwr.supercore import log

from driftfl.common.privacy import PrivacySettings, float_keys

from driftfl.strategies.parts.aggregation import model_norm
from driftfl.strategies.parts.release.base import (ROUNDING, TAIL, PrivateRelease, Released,
                                                   deltas, read_terms, summed)


class DistributedRelease(PrivateRelease):
    """privacy=distributed: each client clips its update to C and adds N(0, (sigma C)^2 /
    m_min); the server sums the m' shares it accepted (or SecAgg+ sums them) and releases
    their mean only if m' >= m_min, so the sum's noise is sigma C sqrt(m'/m_min) >= sigma C.
    The server picks the sample: no amplification is credited. Without secagg the server sees
    each share, and each client's epsilon is accounted for its own share's noise."""

    name = "distributed"

    def __init__(self, settings: PrivacySettings, *, num_clients: int, per_round: int,
                 payload: str = "", secure: bool = False) -> None:
        super().__init__(settings, num_clients=num_clients, per_round=per_round,
                         payload=payload, secure=secure)

    @property
    def shares(self) -> int:
        """m_min: the fewest noise shares a release holds."""
        return self.settings.noise_shares(self.per_round)

    @property
    def raw_payloads(self) -> bool:
        return False  # noised by the client, or masked

    def share_std(self, clip: float) -> float:
        return self.settings.share_noise_std(self.shares, clip)

    def sigma_of(self, summed_count: int) -> float:
        """The noise multiplier the server can see through: the sum's with secagg, one share's
        without."""
        sigma = self.settings.noise_multiplier
        if not self.secure:
            return sigma / math.sqrt(self.shares)
        return sigma * math.sqrt(summed_count / self.shares)

    def round_noise(self, clients):
        shares = self.settings.noise_shares(int(clients))
        return self.settings.noise_multiplier * self.settings.clip / math.sqrt(clients * shares)

    def noise_words(self, clients):
        s = self.settings
        return (f"sigma C / sqrt(m m_min) = {s.noise_multiplier:g} x {s.clip:g} / "
                f"sqrt({clients:g} x {s.noise_shares(int(clients))})")

    def planned(self):
        sigma = self.sigma_of(self.shares)  # the fewest survivors: the least noise
        return 1.0, (sigma,) * (2 if self.payload else 1)

    def enough(self, summed_count: int) -> bool:
        return summed_count >= self.shares

    def reply_bound(self, facts):
        if self.secure:
            return 0.0
        return self.settings.clip + self.share_std(self.settings.clip) * (
            math.sqrt(facts.dimension) + TAIL)

    def admit(self, update, facts):
        if not update.arrays:  # masked (secagg): its client clipped and noised it
            return None
        s = self.settings
        norm = model_norm(dict(enumerate(deltas(update, facts))))
        bound = self.reply_bound(facts) + ROUNDING * model_norm(facts.global_arrays)
        if norm > bound:
            return (f"its update's norm {norm:.4g} exceeds what privacy=distributed lets a "
                    f"client send ({bound:.4g}: clip {s.clip:g} plus its noise)")
        # its noise share alone reaches s (sqrt(d) - TAIL) but with probability exp(-50): a
        # shorter reply skipped its noise (it would leave less in the sum for everyone)
        least = self.share_std(s.clip) * (math.sqrt(facts.dimension) - TAIL) - s.clip
        if norm < least:
            return (f"its update's norm {norm:.4g} is below what its noise share alone reaches "
                    f"({least:.4g}): it did not add the noise privacy=distributed asks for")
        if not facts.payload:
            return None
        terms = read_terms(update, facts)
        if isinstance(terms, str):
            return terms
        norm = model_norm(dict(enumerate(terms)))
        bound = (1 + ROUNDING) * s.payload_clip + self.share_std(s.payload_clip) * (
            math.sqrt(facts.payload_size) + TAIL)
        if norm > bound:
            return (f"its payload's norm {norm:.4g} exceeds what privacy=distributed lets a "
                    f"client send ({bound:.4g}: payload_clip {s.payload_clip:g} plus its noise)")
        return None

    def release(self, server_round, facts, updates, secure=None):
        count = len(updates)
        if secure is not None and secure.mean_update is None:  # nothing is released ...
            # ... but a sum the server unmasked and then withheld was seen: charged as released
            sigma = self.sigma_of(count) if secure.unmasked else math.inf
            self.spend(server_round, 1.0, *[sigma] * (2 if self.payload else 1))
            return Released(updates, withheld=secure.halted)
        sigma = self.sigma_of(count)
        self.spend(server_round, 1.0, *[sigma] * (2 if self.payload else 1))
        if count < len(facts.sent):
            log(WARNING, "round %d: %d of the %d clients sent a message made it into the "
                "release; noise multiplier %.3g", server_round, count, len(facts.sent),
                self.settings.noise_multiplier * math.sqrt(count / self.shares))
        if count < self.shares:
            return Released(updates, withheld=(
                f"{count} of the {len(facts.sent)} clients' noise shares arrived, fewer than "
                f"the {self.shares} the noise needs (privacy.min_survivors="
                f"{self.settings.min_survivors:g}): nothing is released"))
        # m' shares of std sigma C / sqrt(m_min) on the mean over m'
        noise_std = self.settings.noise_multiplier * self.settings.clip / math.sqrt(
            count * self.shares)
        if secure is not None:
            self.diagnose(server_round, secure.mean_update, noise_std)
            return Released(updates, mean_update=secure.mean_update,
                            payload_sum=secure.payload_sum, holders=[u.node_id for u in updates])
        keys = float_keys(facts.global_arrays)
        total = summed([deltas(u, facts) for u in updates],
                       [facts.global_arrays[k].shape for k in keys])
        mean = [t / count for t in total]
        self.diagnose(server_round, mean, noise_std)
        return Released(updates, mean_update=mean,
                        payload_sum=self.payload_terms(updates, facts, None),
                        holders=[u.node_id for u in updates])

    def aggregate_bound(self, facts):
        return self.settings.clip + self.share_std(self.settings.clip) * (
            math.sqrt(facts.dimension) + TAIL)

    def coordinate_reach(self, facts):
        """A clipped update's coordinate is at most C, its noise share's at most TAIL of its
        std; a payload term, clipped to C_p and noised alike, enters over the round's m."""
        clip, payload_clip = self.settings.clip, self.settings.payload_clip or 0.0
        reach = clip + TAIL * self.share_std(clip)
        if facts.payload and payload_clip:
            reach = max(reach, (payload_clip + TAIL * self.share_std(payload_clip))
                        / max(1, len(facts.sent)))
        return reach

    def sum_bound(self, facts):
        clip = self.settings.payload_clip or 0.0
        m = len(facts.sent)
        return m * clip + self.share_std(clip) * math.sqrt(m) * (
            math.sqrt(facts.payload_size) + TAIL)

    def plan(self, rounds: int) -> str:
        s = self.settings
        head = (f"privacy: distributed DP-FedAvg: each client clips its update to C = "
                f"{s.clip:g} and adds noise {s.noise_multiplier:g} x C / sqrt({self.shares}): "
                f"any {self.shares} or more of a round's {self.per_round} clients add up to "
                f"noise {s.noise_multiplier:g} x C at least (privacy.min_survivors="
                f"{s.min_survivors:g}); a round with fewer releases nothing. The server knows "
                "the sample: no amplification is credited")
        if self.secure:
            line = (f"{head}; SecAgg+ shows the server only the sum. Epsilon after {rounds} "
                    f"rounds at delta {s.delta:g}: at most {self.projected(rounds):.3g} (with "
                    f"{self.shares} survivors a round){self.budget_words()}")
        else:
            line = (f"{head}. Without secagg=secaggplus the server sees each client's update "
                    f"with only its own share of the noise (noise multiplier "
                    f"{self.sigma_of(1):.3g}), and epsilon is accounted for that: "
                    f"{self.projected(rounds):.3g} after {rounds} rounds at delta "
                    f"{s.delta:g}{self.budget_words()}; secagg=secaggplus hides all but the sum")
        return line + self.payload_line(f" (each client a share, / sqrt({self.shares}))")
