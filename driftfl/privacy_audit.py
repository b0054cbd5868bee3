"""An empirical privacy audit of one DP-FedAvg round (or a few), which can fail: a distinguishing
game run through driftfl's own release code, whose error rates give a lower bound on epsilon
that holds whatever the accountant says (Jagielski et al., 2020; Nasr et al., 2021).

The game. The adversary fixes the federation: N clients, each with a fixed random update that
the release clips to C, and a canary client whose clipped update is C e, e a random unit
direction orthogonal to every other client's update (the adversary chose the data: the canary
goes where nobody else reaches, as a Dirac canary does). Two neighbouring worlds under the
zero-out relation the accountant assumes: "with", the canary sends C e; "without", it sends a
zero update (it is still a client, and under central DP still sampled with probability q).
Each trial is a fresh run of the round(s) through the real code path; what the adversary sees:

- ``central``: the released mean update (what the server publishes), the round's clients drawn
  by ``CentralRelease.sample`` (Poisson at q from OS entropy) and released by
  ``CentralRelease.release``;
- ``distributed``: the canary's own reply as a curious server receives it without SecAgg+,
  made by the client's ``privatise`` (clip + its noise share N(0, sigma^2 C^2 / m_min));
- ``secure``: only the sum of the round's m replies (SecAgg+'s exact sum under DP, every
  client weighing 1, emulated by summing the ``privatise`` outputs), handed to
  ``DistributedRelease.release`` as a ``SecureSum``.

The statistic is the observation's projection on e, summed over the rounds; the adversary may
first subtract the noise it regenerates from the run's seed (config.yaml tells it), which
only adds variance when the noise comes from OS entropy. Half of each world's trials choose
the statistic and a threshold; on the other half the false-positive and false-negative rates
are bounded above by Clopper-Pearson (each at 97.5 %, so both hold together at 95 %), and

    epsilon_lb = max(log((1 - delta - FNR_u) / FPR_u), log((1 - delta - FPR_u) / FNR_u))

is a lower bound on the epsilon of the mechanism actually run, with 95 % confidence. The claim
it is checked against is the release's own accountant after the audited rounds
(``release.epsilon(rounds)``, from the dp_sigma and dp_q it recorded). A lower bound above the
claim flags the mechanism: it leaks more than it accounts for.

Broken mechanisms (``fault``), to show the audit can fail, run the same code with the noise
draw alone replaced: ``seeded`` draws it from ``default_rng([seed, round])`` (node appended on
a client), as an old version did, and the adversary regenerates it; ``tenth`` adds a tenth of
the noise the release states and accounts. The audit's reach is bounded by its trials: with n
held-out trials a world it cannot show more than about log(n / 3.7).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord
from scipy.stats import beta

from driftfl.client.privacy import privatise
from driftfl.common.privacy import PrivacySettings, add_noise
from driftfl.common.protocol import LOCAL_STEPS, NUM_EXAMPLES
from driftfl.strategies.parts.aggregation import ClientUpdate
from driftfl.strategies.parts.release import (CentralRelease, DistributedRelease, RoundFacts,
                                              SecureSum)

# a small model: the projection on e does not depend on the dimension, the run time does
GLOBAL = {"w": np.zeros((10, 15), np.float32), "b": np.zeros(50, np.float32)}
RECEIVED = ArrayRecord({k: Array(v) for k, v in GLOBAL.items()})  # the model a client gets
MODES = ("central", "distributed", "secure")
FAULTS = ("", "seeded", "tenth")
CANARY = 0  # the canary's node id; the others are 1 .. N - 1
ALPHA = 0.05  # 1 - the confidence of the lower bound


@dataclass(frozen=True)
class Audit:
    """One audited configuration."""

    mode: str  # central | distributed | secure
    sigma: float = 2.0  # privacy.noise_multiplier
    clip: float = 1.0
    num_clients: int = 100  # N (central: the population sampled at ``rate``)
    rate: float = 0.1  # central: q
    per_round: int = 10  # distributed: the m clients of a round, the canary among them
    min_survivors: float = 0.8
    delta: float = 1e-5
    rounds: int = 1  # the canary takes part in every one; the statistic sums them
    fault: str = ""  # "": the real mechanism; seeded | tenth: a broken one

    @property
    def label(self) -> str:
        fault = {"": "", "seeded": ", noise from the seed", "tenth": ", noise at sigma / 10"}
        return self.mode + fault[self.fault]

    def settings(self) -> PrivacySettings:
        if self.mode == "central":
            return PrivacySettings(name="central", clip=self.clip,
                                   noise_multiplier=self.sigma, delta=self.delta)
        return PrivacySettings(name="distributed", clip=self.clip, noise_multiplier=self.sigma,
                               delta=self.delta, min_survivors=self.min_survivors)


@dataclass
class Result:
    audit: Audit
    claimed: float  # the release's epsilon after the audited rounds
    lower_bound: float  # the empirical epsilon at 95 % confidence
    statistic: str  # the adversary's choice: "projection" or "seed-subtracted"
    fpr: float  # the held-out error rates of the chosen test
    fnr: float
    columns: dict  # the release's columns for the last round (dp_sigma, dp_q, epsilon)

    @property
    def flagged(self) -> bool:
        return self.lower_bound > self.claimed


# -- the lower bound --------------------------------------------------------------------------
def clopper_pearson_upper(k, n, alpha: float = ALPHA):
    """The upper end of the two-sided 1 - alpha Clopper-Pearson interval of k successes in n
    (1 where k = n): it holds with probability 1 - alpha / 2."""
    k = np.asarray(k, dtype=float)
    upper = beta.ppf(1 - alpha / 2, k + 1, np.maximum(n - k, 1e-12))
    return np.where(k >= n, 1.0, upper)


def epsilon_lower_bound(false_pos, negatives: int, false_neg, positives: int,
                        delta: float, alpha: float = ALPHA):
    """The epsilon that a test with these error counts proves at ``delta``, with confidence
    1 - alpha (0 where it proves nothing)."""
    fpr = clopper_pearson_upper(false_pos, negatives, alpha)
    fnr = clopper_pearson_upper(false_neg, positives, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        one = np.log(np.maximum(1 - delta - fnr, 0) / fpr)
        two = np.log(np.maximum(1 - delta - fpr, 0) / fnr)
    return np.maximum(np.nan_to_num(np.maximum(one, two), nan=0.0, neginf=0.0), 0.0)


def errors(without: np.ndarray, with_: np.ndarray, thresholds) -> tuple:
    """False positives and negatives of "with" when the statistic exceeds each threshold."""
    false_pos = without.size - np.searchsorted(np.sort(without), thresholds, side="right")
    false_neg = np.searchsorted(np.sort(with_), thresholds, side="right")
    return false_pos, false_neg


def best_threshold(without: np.ndarray, with_: np.ndarray, delta: float) -> tuple[float, float]:
    """The threshold whose bound on these trials is highest, and that bound."""
    values = np.unique(np.concatenate([without, with_]))
    # midway between neighbouring values: a threshold at an observed value would sit on the
    # edge of a tie that float rounding breaks at random on the held-out half
    thresholds = np.concatenate([[values[0] - 1.0], (values[1:] + values[:-1]) / 2])
    false_pos, false_neg = errors(without, with_, thresholds)
    bounds = epsilon_lower_bound(false_pos, without.size, false_neg, with_.size, delta)
    i = int(np.argmax(bounds))
    return float(thresholds[i]), float(bounds[i])


# -- the federation and its rounds ------------------------------------------------------------
def flat(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])


def unflat(vector: np.ndarray) -> dict[str, np.ndarray]:
    out, at = {}, 0
    for key, ref in GLOBAL.items():
        out[key] = vector[at:at + ref.size].reshape(ref.shape).astype(ref.dtype)
        at += ref.size
    return out


@dataclass(frozen=True)
class Federation:
    """The adversary's fixed data: each client's raw update (flat), the canary's direction."""

    updates: np.ndarray  # [N, d]: row CANARY is the canary's "with" update
    direction: np.ndarray  # e

    @staticmethod
    def make(clients: int, clip: float, seed: int = 0) -> Federation:
        d = sum(v.size for v in GLOBAL.values())
        if clients >= d:
            raise ValueError(f"{clients} clients leave no direction of the {d} free for e")
        rng = np.random.default_rng(seed)
        # norms from well below to well above C: some are clipped, some not
        others = rng.standard_normal((clients - 1, d))
        others *= (clip * rng.uniform(0.2, 3.0, (clients - 1, 1))
                   / np.linalg.norm(others, axis=1, keepdims=True))
        basis, _ = np.linalg.qr(others.T)  # the others' span
        e = rng.standard_normal(d)
        e -= basis @ (basis.T @ e)
        e /= np.linalg.norm(e)
        canary = 10 * clip * e  # clipped by the release (or its client) to C e
        return Federation(np.vstack([canary, others]), e)

    def update(self, node: int, canary_in: bool) -> np.ndarray:
        if node == CANARY and not canary_in:
            return np.zeros_like(self.direction)  # zero-out: the canary sends nothing
        return self.updates[node]


def reply(node: int, delta: np.ndarray) -> ClientUpdate:
    arrays = {k: GLOBAL[k] + v for k, v in unflat(delta).items()}
    return ClientUpdate(node, arrays, {NUM_EXAMPLES: 1.0, LOCAL_STEPS: 1.0}, None)


def facts(sent: list[int], population: int) -> RoundFacts:
    return RoundFacts(GLOBAL, sent, {}, "", list(range(population)))


def seeded_rng(seed: int, server_round: int, node: int | None = None) -> np.random.Generator:
    """The generator an old version drew DP noise from: the experiment's seed and the round
    (and on a client its node), all of which the server knows."""
    return np.random.default_rng([seed, server_round] + ([] if node is None else [node]))


def regenerated(std: float, rng: np.random.Generator) -> np.ndarray:
    """The noise ``add_noise`` draws from ``rng`` on the model's float arrays, flat."""
    return flat(add_noise([np.zeros(v.shape) for v in GLOBAL.values()], std, rng))


# -- central ------------------------------------------------------------------------------------
class BrokenCentral(CentralRelease):
    """CentralRelease with its noise draw alone broken: the clip, the sum, the denominator and
    the accountant's record of sigma are the real release's own."""

    def __init__(self, *args, fault: str, seed: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fault, self.seed = fault, seed

    def noise(self, server_round, arrays, std):
        if self.fault == "tenth":
            return add_noise(arrays, std / 10)
        return add_noise(arrays, std, seeded_rng(self.seed, server_round))


def central_release(audit: Audit, seed: int) -> CentralRelease:
    sizes = {"num_clients": audit.num_clients, "per_round": round(audit.rate * audit.num_clients),
             "rate": audit.rate}
    if audit.fault:
        return BrokenCentral(audit.settings(), fault=audit.fault, seed=seed, **sizes)
    return CentralRelease(audit.settings(), **sizes)


def central_trial(audit: Audit, fed: Federation, canary_in: bool, seed: int):
    """One run: (the release, the observations' projections raw and seed-subtracted)."""
    release = central_release(audit, seed)
    nodes = list(range(audit.num_clients))
    raw = subtracted = 0.0
    for r in range(1, audit.rounds + 1):
        # the real Poisson sample at q from OS entropy (the broken releases' too): the canary
        # is in it with probability q in both worlds
        sent = release.sample(nodes, None)
        out = release.release(r, facts(sent, audit.num_clients),
                              [reply(n, fed.update(n, canary_in)) for n in sent])
        seen = flat(out.mean_update) @ fed.direction
        guess = regenerated(audit.sigma * audit.clip, seeded_rng(seed, r)) @ fed.direction
        raw += seen
        subtracted += seen - guess / release.expected
    return release, raw, subtracted


# -- distributed, with and without SecAgg+ ------------------------------------------------------
def share(audit: Audit, settings: PrivacySettings, shares: int, delta: np.ndarray,
          seed: int, server_round: int, node: int) -> np.ndarray:
    """A client's reply (flat update) by ``privatise``; a broken client draws its noise from
    the seed or at a tenth of sigma, and tells the server sigma all the same."""
    rng = seeded_rng(seed, server_round, node) if audit.fault == "seeded" else None
    if audit.fault == "tenth":
        settings = settings.model_copy(update={"noise_multiplier": audit.sigma / 10})
    trained = ArrayRecord({k: Array(v) for k, v in reply(node, delta).arrays.items()})
    sent = privatise(trained, RECEIVED, settings, shares, rng)
    return flat(sent[k].numpy() - GLOBAL[k] for k in GLOBAL)


def distributed_trial(audit: Audit, fed: Federation, canary_in: bool, seed: int):
    secure = audit.mode == "secure"
    settings = audit.settings()
    release = DistributedRelease(settings, num_clients=audit.num_clients,
                                 per_round=audit.per_round, secure=secure)
    nodes, std = list(range(audit.per_round)), release.share_std(audit.clip)
    raw = subtracted = 0.0
    for r in range(1, audit.rounds + 1):
        sent = [share(audit, settings, release.shares, fed.update(n, canary_in), seed, r, n)
                for n in nodes]
        updates = [reply(n, s) for n, s in zip(nodes, sent)]
        if secure:  # the server sees only the sum (SecAgg+'s mean, every client weighing 1)
            total = np.sum(sent, axis=0)
            out = release.release(r, facts(nodes, audit.num_clients), updates, SecureSum(
                updates, {}, set(nodes), list(unflat(total / len(nodes)).values())))
            seen = flat(out.mean_update) * len(nodes)
            guess = sum(regenerated(std, seeded_rng(seed, r, n)) for n in nodes)
        else:  # the server sees each reply; the canary's is what it learns the canary from
            refused = release.admit(updates[CANARY], facts(nodes, audit.num_clients))
            if refused and not audit.fault:  # an honest reply must be taken; a broken one
                # may be refused (too little noise), but the server has seen it all the same
                raise RuntimeError(f"the canary's reply was refused: {refused}")
            release.release(r, facts(nodes, audit.num_clients), updates)
            seen, guess = sent[CANARY], regenerated(std, seeded_rng(seed, r, CANARY))
        raw += seen @ fed.direction
        subtracted += (seen - guess) @ fed.direction
    return release, raw, subtracted


# -- the audit ------------------------------------------------------------------------------------
def observe(audit: Audit, trials: int, fed: Federation | None = None):
    """``trials`` runs in each world: the statistics [world, statistic, trial], world 0
    without the canary, statistic 0 raw and 1 seed-subtracted; and the last run's release."""
    fed = fed or Federation.make(audit.num_clients, audit.clip)
    trial = central_trial if audit.mode == "central" else distributed_trial
    stats = np.empty((2, 2, trials))
    for world in (0, 1):
        for t in range(trials):
            release, raw, subtracted = trial(audit, fed, bool(world), seed=t)  # run t's seed
            stats[world, :, t] = raw, subtracted
    return stats, release


def run(audit: Audit, trials: int = 2000) -> Result:
    """The audit of ``audit`` over ``trials`` runs per world, half to choose, half to judge."""
    if audit.mode not in MODES or audit.fault not in FAULTS:
        raise ValueError(f"mode {audit.mode!r} or fault {audit.fault!r} unknown")
    stats, release = observe(audit, trials)
    half = trials // 2
    choices = [best_threshold(stats[0, s, :half], stats[1, s, :half], audit.delta)
               for s in (0, 1)]
    s = int(np.argmax([bound for _, bound in choices]))  # the adversary's better statistic
    false_pos, false_neg = errors(stats[0, s, half:], stats[1, s, half:], choices[s][0])
    held = trials - half
    bound = float(epsilon_lower_bound(false_pos, held, false_neg, held, audit.delta))
    return Result(audit, release.epsilon(audit.rounds), bound,
                  ("projection", "seed-subtracted")[s], false_pos / held, false_neg / held,
                  release.columns(audit.rounds))


def audits(sigma: float, rounds: int = 1, **sizes) -> list[Audit]:
    """Every mode, real and broken, at noise multiplier ``sigma``."""
    return [Audit(mode, sigma=sigma, rounds=rounds, fault=fault, **sizes)
            for fault in FAULTS for mode in MODES]


def ceiling(trials: int, delta: float = 1e-5) -> float:
    """The most epsilon ``trials`` runs per world can show: no error on the held-out half."""
    held = trials - trials // 2
    return float(epsilon_lower_bound(0, held, 0, held, delta))

