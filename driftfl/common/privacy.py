"""User-level differential privacy (DP-FedAvg) and secure aggregation: the settings, and the
mechanism's arithmetic shared by the server (central) and the clients (distributed).

DP-FedAvg (McMahan et al., 2018): each selected client's model update is clipped to L2 norm
``clip`` = C and summed, every client once (not weighted by examples: a client's weight would be
its own sensitivity), and the sum carries Gaussian noise of standard deviation sigma C. One
client's data moves the sum by at most C (its update replaced by a zero one: the zero-out
neighbour relation, which dp-accounting accounts as add/remove), so sigma is the noise
multiplier the accountant composes over rounds.

- ``central``: the server clips every reply, noises the sum and divides it by the expected
  number of clients, q N (a fixed denominator); it draws the round's clients by Poisson
  sampling at rate q from the operating system's entropy, a sample nobody else can know, so the
  accountant may credit amplification by sampling.
- ``distributed``: each client clips its own update and adds N(0, (sigma C)^2 / m_min), m_min =
  ``min_survivors`` of the round's clients: any m' >= m_min shares add up to noise sigma C
  sqrt(m' / m_min) >= sigma C. The server knows the sample, so nothing is credited for it. Alone,
  a client's share protects little: with secure aggregation the server sees only the sum.

Noise is drawn from the operating system's entropy (a fresh generator per draw), never from a
seed. Flower's clipping primitive (flwr.supercore.differential_privacy) clips; dp-accounting does
the accounting (driftfl.common.accounting).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from .settings import MANY, Settings, changed


ADAPTIVE = frozenset({"adaptive_clip", "target_quantile", "clip_lr", "count_noise"})


class PrivacySettings(Settings):
    name: Literal["none", "central", "distributed"] = "none"
    clip: float = Field(1.0, gt=0, description=(
        "C: the L2 norm every client's model update is clipped to"))
    noise_multiplier: float = Field(1.0, ge=0, le=MANY, description=(
        "sigma: the sum of the clipped updates carries Gaussian noise of standard deviation "
        "sigma C"))
    delta: float = Field(1e-5, gt=0, lt=1, description="the delta epsilon is reported at")
    target_epsilon: float | None = Field(None, gt=0, description=(
        "stop the run, with one line, before a round would take epsilon past this; null: no "
        "budget"))
    payload_clip: float | None = Field(None, gt=0, description=(
        "C_p: the L2 norm each client's method payload is clipped to, where the method sends "
        "one (SCAFFOLD's control delta, FedCurv's Fisher terms, FedProto's and FedCSD's class "
        "prototypes), its sum noised by sigma C_p; null: the method's own default (SCAFFOLD "
        "0.3, FedCurv 1, FedProto 10, FedCSD 5)"))
    min_survivors: int | float = Field(0.8, description=(
        "distributed: the fewest clients whose noise shares make sigma, a count or a share in "
        "(0, 1] of the clients a round selects (0.8: 8 of 10); a round with fewer releases "
        "nothing"))
    exact_diagnostics: bool = Field(False, description=(
        "central: record each round's exact median update norm and share clipped "
        "(dp_median_norm, dp_clipped_share) in the console, metrics and summary; they are a "
        "function of that round's clients' data with no noise on them, not covered by "
        "epsilon: keep those outputs private"))
    adaptive_clip: bool = Field(False, description=(
        "central: adaptive clipping (Andrew et al., 2021): C starts at clip and follows the "
        "target_quantile of the update norms, C <- C exp(-clip_lr (b - target_quantile)), b the "
        "noised share of updates not clipped"))
    target_quantile: float = Field(0.5, ge=0, le=1, description=(
        "adaptive_clip: the quantile of the update norms the clip follows"))
    clip_lr: float = Field(0.2, gt=0, description=(
        "adaptive_clip: how far the clip moves each round (the geometric update's rate)"))
    count_noise: float | None = Field(None, gt=0, description=(
        "adaptive_clip: the noise std of the count of unclipped updates, taken out of sigma's "
        "budget; null: the expected clients per round / 20, as Flower's"))

    @model_validator(mode="after")
    def _coherent(self):
        if self.name == "none":
            stray = changed(self)  # a section off takes none
            if stray:
                raise ValueError(f"privacy.{stray[0]} means nothing without differential privacy; "
                                 "choose privacy=central or privacy=distributed")
            return self
        if self.target_epsilon is not None and self.noise_multiplier == 0:
            raise ValueError("privacy.target_epsilon needs noise: privacy.noise_multiplier=0 "
                             "spends an infinite epsilon in the first round")
        survivors = self.min_survivors
        if isinstance(survivors, bool) or (isinstance(survivors, int) and survivors < 1) or (
                isinstance(survivors, float) and not 0 < survivors <= 1):
            raise ValueError(f"privacy.min_survivors={survivors} must be a count >= 1 or a "
                             "share in (0, 1]")
        stray = set(changed(self))
        if self.name == "distributed" and stray & ADAPTIVE:
            raise ValueError("privacy.adaptive_clip is for privacy=central: under distributed "
                             "each client would send whether it was clipped in the clear")
        if self.name == "distributed" and self.exact_diagnostics:
            raise ValueError("privacy.exact_diagnostics is for privacy=central: under "
                             "distributed the server never sees an update before its client "
                             "clipped and noised it")
        if self.name == "central" and "min_survivors" in stray:
            raise ValueError("privacy.min_survivors is for privacy=distributed: under central "
                             "the server adds all the noise itself")
        if not self.adaptive_clip and stray & ADAPTIVE:
            raise ValueError("privacy.target_quantile, clip_lr and count_noise set adaptive "
                             "clipping: add privacy.adaptive_clip=true")
        return self

    @property
    def enabled(self) -> bool:
        return self.name != "none"

    def noise_shares(self, per_round: int) -> int:
        """m_min: the clients whose noise shares make sigma C (distributed), for a round that
        selects ``per_round`` clients."""
        survivors = self.min_survivors
        if isinstance(survivors, float):
            survivors = math.ceil(survivors * per_round - 1e-9)
        return max(1, survivors)

    def share_noise_std(self, shares: int, clip: float | None = None) -> float:
        """One client's share of the noise (distributed): ``shares`` of them add up to sigma C
        (with ``clip``, sigma C_p on a payload clipped to it)."""
        return self.noise_multiplier * (clip or self.clip) / math.sqrt(shares)


class SecAggSettings(Settings):
    """Flower's SecAgg+ protocol (Bell et al., 2020), with its own settings' names
    (flwr.server.workflow.SecAggPlusWorkflow); what its ``_check_init_params`` refuses is
    refused here, as one line, before anything runs. driftfl.server.secure runs it."""

    name: Literal["none", "secaggplus"] = "none"
    num_shares: int | float = Field(3, description=(
        "each client shares its secrets with num_shares - 1 neighbours: an odd count > 2, or a "
        "float in (0, 1]: that share of the round's clients (as Flower reads it)"))
    reconstruction_threshold: int | float = Field(2, description=(
        "shares needed to rebuild a client's masks: a count below num_shares, or a float in "
        "(0, 1]: that share of num_shares (at least 2); higher: more clients must collude to "
        "unmask one, lower: more may drop out (a client's neighbourhood may lose all but this "
        "many)"))
    clipping_range: Literal["auto"] | float = Field("auto", description=(
        "each coordinate of a client's weighted update is clipped to +- this before "
        "quantisation; auto: each round, what an honest one can reach, the round's update "
        "bound (distributed DP: the clip plus the noise share's reach)"))
    quantization_range: int = Field(4_194_304, gt=0, description=(
        "... and quantised to this many integer levels"))
    modulus_range: int = Field(4_294_967_296, gt=0, le=2**32, description=(
        "the masks' modulus: a power of 2 above quantization_range, at most 2**32"))
    max_weight: float = Field(100_000.0, gt=0, description=(
        "the largest weight (example count) a client may carry, checked after the data "
        "survey; a round scales weights by the largest count among its clients, at most this "
        "(Flower's default 1000 is below one Fashion-MNIST client's share)"))

    @field_validator("clipping_range", mode="before")
    @classmethod
    def _auto_or_positive(cls, value):
        if value == "auto":
            return value
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = float("nan")
        if not number > 0 or isinstance(value, bool):
            raise ValueError("must be auto or a number > 0")
        return number

    @model_validator(mode="after")
    def _coherent(self):
        if self.name == "none":  # (a saved experiment's JSON holds the defaults: those pass)
            stray = changed(self)  # a section off takes none
            if stray:
                raise ValueError(f"secagg.{stray[0]} means nothing without secure aggregation; "
                                 "choose secagg=secaggplus")
            return self
        shares, threshold = self.num_shares, self.reconstruction_threshold
        if isinstance(shares, int) and shares != 1 and (shares <= 2 or shares % 2 == 0):
            raise ValueError(f"secagg.num_shares={shares} as a count must be odd and greater "
                             "than 2 (a client and its neighbours on either side), or a share "
                             "in (0, 1]")
        if isinstance(shares, float) and not 0 < shares <= 1:
            raise ValueError(f"secagg.num_shares={shares} as a share must be in (0, 1]")
        if isinstance(threshold, int) and threshold != 1:
            if threshold < 1:
                raise ValueError(f"secagg.reconstruction_threshold={threshold} must be >= 1")
            if isinstance(shares, int) and shares != 1 and threshold >= shares:
                raise ValueError(f"secagg.reconstruction_threshold={threshold} must be less "
                                 f"than secagg.num_shares={shares}")
        if isinstance(threshold, float) and not 0 < threshold <= 1:
            raise ValueError(f"secagg.reconstruction_threshold={threshold} as a share must be "
                             "in (0, 1]")
        if self.modulus_range <= self.quantization_range:
            raise ValueError(f"secagg.modulus_range={self.modulus_range} must be greater than "
                             f"secagg.quantization_range={self.quantization_range}")
        if self.modulus_range & (self.modulus_range - 1):
            raise ValueError(f"secagg.modulus_range={self.modulus_range} must be a power of 2")
        return self

    @property
    def enabled(self) -> bool:
        return self.name != "none"

    def protocol_sizes(self, clients: int) -> tuple[int, int]:
        """(the neighbourhood, the threshold) SecAggPlusWorkflow.setup_stage makes of these
        settings for a round of ``clients``: each client's masks can be rebuilt while at least
        ``threshold`` of its ``neighbourhood`` (itself included) stay."""
        shares = self.num_shares
        if isinstance(shares, float) or shares == 1:
            shares = round(float(shares) * clients)
            if shares < clients and shares % 2 == 0:
                shares += 1
            if shares <= 2:
                shares = clients
        threshold = self.reconstruction_threshold
        if isinstance(threshold, float) or threshold == 1:
            threshold = max(round(float(threshold) * shares), 2)
        if clients != shares and shares % 2 == 0:
            shares += 1
        return min(2 * (shares // 2) + 1, clients), threshold


def float_keys(arrays: dict[str, np.ndarray]) -> list[str]:
    """The arrays DP and SecAgg+ cover, in the model's order: the float ones (a counter such as
    BatchNorm's is not an update)."""
    return [k for k, v in arrays.items() if v.dtype.kind == "f"]


def clip_update(update: list[np.ndarray], clip: float, *,
                in_place: bool = False) -> tuple[list[np.ndarray], float]:
    """``update`` scaled to L2 norm at most ``clip`` (over all its arrays together), and its
    norm before: Flower's clipping primitive, on a copy unless ``in_place``."""
    from flwr.supercore.differential_privacy import clip_inputs_inplace, get_norm

    clipped = update if in_place else [np.array(a, copy=True) for a in update]
    norm = get_norm(clipped)
    if norm > 0:  # Flower's divides by the norm: a zero update (a client that learned nothing)
        clip_inputs_inplace(clipped, clip)
    return clipped, float(norm)


def add_noise(arrays: list[np.ndarray], std: float,
              rng: np.random.Generator | None = None) -> list[np.ndarray]:
    """``arrays`` plus independent N(0, std^2) on every coordinate, drawn from ``rng`` or else
    from a generator seeded afresh by the operating system's entropy: DP noise is never
    reproducible from anything a run keeps or is told (a test passes its own ``rng`` to
    measure the scale)."""
    rng = rng if rng is not None else np.random.default_rng()
    return [(a + rng.normal(0.0, std, a.shape)).astype(a.dtype, copy=False) for a in arrays]
