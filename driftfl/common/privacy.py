"""User-level differential privacy (DP-FedAvg) and secure aggregation: the settings, and the
mechanism's arithmetic shared by the server (central) and the clients (distributed).

DP-FedAvg (McMahan et al., 2018): each selected client's model update is clipped to L2 norm
``clip`` = C; the round's update is the plain mean of the m clipped updates (not weighted by
examples: a client's weight would be its own sensitivity), plus Gaussian noise of standard
deviation sigma C / m. The mean over a fixed m moves by at most C / m when one client's data
changes, so sigma is the noise multiplier the accountant composes over rounds, with the share
of clients selected per round as its sampling rate.

- ``central``: the server clips every reply and noises the mean; it sees each update.
- ``distributed``: each client clips its own update and adds N(0, (sigma C)^2 / m) to it, so the
  sum of m replies carries N(0, (sigma C)^2), the same as central. Alone, a client's share of
  the noise protects little: with secure aggregation the server sees only the noised sum.

Flower's clipping and noise primitives (flwr.supercore.differential_privacy) do the arithmetic;
dp-accounting does the accounting (driftfl.common.accounting).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from .settings import MANY, Settings


class PrivacySettings(Settings):
    name: Literal["none", "central", "distributed"] = "none"
    clip: float = Field(1.0, gt=0)  # C: the L2 norm every client's update is clipped to
    noise_multiplier: float = Field(1.0, ge=0, le=MANY)  # sigma: the noise is sigma C / m
    delta: float = Field(1e-5, gt=0, lt=1)  # the delta epsilon is reported at
    # stop the run, with one line, before a round would take epsilon past this; None: no budget
    target_epsilon: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _coherent(self):
        if self.name == "none":
            stray = _changed(self)
            if stray:
                raise ValueError(f"privacy.{stray[0]} means nothing without differential privacy; "
                                 "choose privacy=central or privacy=distributed")
            return self
        if self.target_epsilon is not None and self.noise_multiplier == 0:
            raise ValueError("privacy.target_epsilon needs noise: privacy.noise_multiplier=0 "
                             "spends an infinite epsilon in the first round")
        return self

    @property
    def enabled(self) -> bool:
        return self.name != "none"

    def mean_noise_std(self, clients: int) -> float:
        """The noise on the round's mean update of ``clients`` clipped updates."""
        return self.noise_multiplier * self.clip / clients

    def share_noise_std(self, clients: int) -> float:
        """One client's share of that noise (distributed): m shares add up to sigma C."""
        return self.noise_multiplier * self.clip / math.sqrt(clients)


class SecAggSettings(Settings):
    """Flower's SecAgg+ protocol (Bell et al., 2020), with its own settings' names and defaults
    (flwr.server.workflow.SecAggPlusWorkflow)."""

    name: Literal["none", "secaggplus"] = "none"
    # each client shares its secrets with this many others (or this share of the round's
    # clients, if < 1 ... as Flower reads it: an int counts, a float in (0, 1] is a share)
    num_shares: int | float = Field(1.0, gt=0)
    # shares needed to rebuild a dropped client's mask; more clients than this may not drop
    reconstruction_threshold: int | float = Field(1.0, gt=0)
    clipping_range: float = Field(8.0, gt=0)  # each coordinate is clipped to +- this
    quantization_range: int = Field(4_194_304, gt=1)  # ... and quantised to this many levels
    modulus_range: int = Field(4_294_967_296, gt=1)  # the masks' modulus
    # the largest weight a client may carry (its example count, before SecAgg+ scales it)
    max_weight: float = Field(1000.0, gt=0)

    @model_validator(mode="after")
    def _coherent(self):
        if self.name == "none":
            stray = _changed(self)
            if stray:
                raise ValueError(f"secagg.{stray[0]} means nothing without secure aggregation; choose "
                                 "secagg=secaggplus")
        return self

    @property
    def enabled(self) -> bool:
        return self.name != "none"


def _changed(settings: Settings) -> list[str]:
    """The settings that differ from their defaults (a section off takes none)."""
    fields = type(settings).model_fields
    return [key for key, field in fields.items()
            if key != "name" and getattr(settings, key) != field.default]


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


def add_noise(arrays: list[np.ndarray], std: float, rng: np.random.Generator) -> list[np.ndarray]:
    """``arrays`` plus independent N(0, std^2) on every coordinate, drawn from ``rng`` (seeded
    where a test or a reproducible server asks for it)."""
    return [(a + rng.normal(0.0, std, a.shape)).astype(a.dtype, copy=False) for a in arrays]
