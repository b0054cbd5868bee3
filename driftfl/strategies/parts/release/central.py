"""privacy=central: DP-FedAvg with the server trusted with each update (see base.py)."""

from __future__ import annotations

import math
from logging import WARNING

import numpy as np
from flwr.supercore import log

from driftfl.common.privacy import PrivacySettings, clip_update, float_keys

from driftfl.strategies.parts.release.base import (TAIL, PrivateRelease, Released, deltas,
                                                   read_terms, summed)


class CentralRelease(PrivateRelease):
    """privacy=central: the trusted server draws the round's clients by Poisson sampling at
    rate q from the operating system's entropy, clips each reply's update to C (and its payload
    to C_p), sums, adds N(0, sigma^2 C^2) (and sigma C_p on the payload's sum) and divides by
    the expected count q N. With adaptive clipping C follows a quantile of the update norms,
    out of the same budget (Andrew et al., 2021)."""

    name = "central"

    def __init__(self, settings: PrivacySettings, *, num_clients: int, per_round: int,
                 rate: float, payload: str = "") -> None:
        super().__init__(settings, num_clients=num_clients, per_round=per_round,
                         payload=payload)
        self.rate = rate  # q: each client's chance to be in a round's sample
        self.clip = settings.clip  # C this round (adaptive clipping moves it)

    @property
    def raw_payloads(self) -> bool:
        return True  # the trusted server reads each reply as sent

    @property
    def expected(self) -> float:
        """q N: the fixed denominator, the sample's expected size."""
        return self.rate * self.num_clients

    def count_noise(self) -> float:
        """Adaptive clipping: the std of the noise on the count of unclipped updates."""
        s = self.settings
        return s.count_noise if s.count_noise is not None else self.expected / 20

    def multipliers(self) -> tuple[float, ...]:
        """The noise multipliers of the round's sums: the update's, the payload's, and with
        adaptive clipping the count's (its sum of b_k - 1/2 has sensitivity 1/2), chosen so
        that together they spend what sigma alone would (Flower's compute_adaptive_noise_params)."""
        s, sigmas = self.settings, []
        if s.adaptive_clip and s.noise_multiplier > 0:
            from flwr.supercore.differential_privacy import compute_adaptive_noise_params

            count_std, update_sigma = compute_adaptive_noise_params(
                s.noise_multiplier, self.expected, self.count_noise())
            sigmas = [update_sigma, *([s.noise_multiplier] if self.payload else []),
                      2 * count_std]
        else:
            sigmas = [s.noise_multiplier] * (2 if self.payload else 1)
        return tuple(sigmas)

    @property
    def stream_names(self) -> list[str]:
        names = super().stream_names
        return names + (["dp_sigma_count"] if self.settings.adaptive_clip else [])

    def planned(self):
        return self.rate, self.multipliers()

    def round_noise(self, clients):
        return self.multipliers()[0] * self.settings.clip / clients

    def noise_words(self, clients):
        return (f"sigma C / m = {self.multipliers()[0]:.3g} x {self.settings.clip:g} / "
                f"{clients:g}")

    def sample(self, nodes, choose):
        # Poisson sampling from OS entropy: amplification holds only for a sample nobody
        # but the server can know (not the seeded selection, which config.yaml repeats)
        draws = np.random.default_rng().random(len(nodes))
        return [n for n, draw in zip(nodes, draws) if draw < self.rate]

    def admit(self, update, facts):
        if not facts.payload or not update.arrays:
            return None
        terms = read_terms(update, facts)
        return terms if isinstance(terms, str) else None

    def release(self, server_round, facts, updates, secure=None):
        s, sigmas = self.settings, self.multipliers()
        keys = float_keys(facts.global_arrays)
        clipped, norms = [], []
        for update in updates:
            delta, norm = clip_update(deltas(update, facts), self.clip, in_place=True)
            clipped.append(delta)
            norms.append(norm)
        unclipped = sum(norm <= self.clip for norm in norms)
        shapes = [facts.global_arrays[k].shape for k in keys]
        total = self.noise(server_round, summed(clipped, shapes), sigmas[0] * self.clip)
        mean = [t / self.expected for t in total]
        self.diagnose(server_round, mean, sigmas[0] * self.clip / self.expected,
                      norms if s.exact_diagnostics else None, self.clip)
        payload = self.payload_terms(updates, facts, s.payload_clip)
        if payload is not None:
            payload = dict(zip(payload, self.noise(server_round, list(payload.values()),
                                                   s.noise_multiplier * s.payload_clip)))
        self.spend(server_round, self.rate, *sigmas)
        if len(updates) < len(facts.sent):
            log(WARNING, "round %d: %d of the %d sampled clients' replies entered the release; "
                "the others count as zero updates", server_round, len(updates), len(facts.sent))
        if s.adaptive_clip:
            self.adapt(len(updates), unclipped, sigmas[-1] / 2)
        return Released(updates, mean_update=mean, payload_sum=payload,
                        holders=list(facts.population), holder_share=self.rate)

    def adapt(self, count: int, unclipped: int, count_std: float) -> None:
        """C <- C exp(-clip_lr (b - target_quantile)), b the noised share of updates that were
        not clipped: sum_k (b_k - 1/2) + N(0, count_std^2) over q N, plus 1/2."""
        s = self.settings
        noised = (unclipped - count / 2 + float(np.random.default_rng().normal(0.0, count_std))
                  ) / self.expected + 0.5
        self.clip *= math.exp(-s.clip_lr * (noised - s.target_quantile))

    def columns(self, server_round):
        out = super().columns(server_round)
        if self.settings.adaptive_clip:
            out["dp_clip"] = self.clip
        return out

    def aggregate_bound(self, facts):
        return (self.clip * len(facts.sent) + self.multipliers()[0] * self.clip * (
            math.sqrt(facts.dimension) + TAIL)) / self.expected

    def sum_bound(self, facts):
        clip = self.settings.payload_clip or 0.0
        return clip * (len(facts.sent) + self.settings.noise_multiplier * (
            math.sqrt(facts.payload_size) + TAIL))

    def plan(self, rounds: int) -> str:
        s = self.settings
        clip = (f"to C = {s.clip:g} (adaptive: it follows the {s.target_quantile:g} quantile "
                f"of the update norms, clip_lr {s.clip_lr:g})" if s.adaptive_clip
                else f"to C = {s.clip:g}")
        line = (f"privacy: central DP-FedAvg: the server draws each round's clients by Poisson "
                f"sampling at q = {self.rate:g} from the operating system's entropy, clips "
                f"each update {clip}, sums them with noise {s.noise_multiplier:g} x C and "
                f"divides by q N = {self.expected:g}; epsilon after {rounds} rounds at delta "
                f"{s.delta:g}: {self.projected(rounds):.3g}{self.budget_words()}, amplification "
                "by the secret sample credited (keep metrics.csv and checkpoint.pt private: "
                "they name each round's clients)")
        return line + self.payload_line("")
