"""DCFL's settings, importable without torch or Flower (driftfl.specs.methods declares DCFL with
them): the half its clients read (how they condense their data and train on condensed images), the
strategy's (``DCFLSettings`` extends the clients', one ``strategy`` section, checked whole on
the server; a client reads only its own fields), and its CKA selection's.

Defaults are CPU-friendly (DM with 200 iterations takes seconds per client with the MLP);
the DM/DC/DSA authors' paper-grade settings are in docs/algorithms.md (DCFL).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from driftfl.common.dsa_transforms import DEFAULT_TRANSFORMS, parse_transforms
from driftfl.common.errors import ConfigError
from driftfl.common.settings import MANY, Settings, StrategySettings, validated

if TYPE_CHECKING:  # flwr is not needed to condense (benchmarks run it where flwr is not)
    from flwr.app import ArrayRecord


class CondensationSettings(Settings):
    condensation: Literal["dm", "dc", "dsa", "real"] = Field("dm", description=(
        "how clients condense: distribution matching (dm), gradient matching (dc), dc with "
        "differentiable Siamese augmentation (dsa); real: a research ablation, NOT private, "
        "simulation only: each client ships ipc random real images of each class instead "
        "(the bound of what condensed images could do)"))
    condense_init: Literal["noise", "real"] = Field("noise", description=(
        "where the synthetic images start: N(0, 1) noise, or real images (the DM/DC authors' "
        "default, which ships near-copies of them at a few hundred iterations)"))
    condense_dp: bool = Field(False, description=(
        "DP-DM: clipped, noised real embeddings (condensation=dm from noise only)"))
    condense_dp_clip: float | None = Field(None, gt=0, description=(
        "C, each real embedding's norm bound; null: the median embedding norm of N(0, 1) images "
        "under fresh networks of the model, from a public seed (no client's data)"))
    condense_dp_noise: float | None = Field(None, gt=0, description=(
        "sigma, the noise multiplier (set it or condense_dp_epsilon)"))
    condense_dp_epsilon: float | None = Field(None, gt=0, description=(
        "the epsilon each class's sigma is chosen to meet (set it or condense_dp_noise)"))
    condense_dp_delta: float = Field(1e-5, gt=0, lt=1, description=(
        "delta of the (epsilon, delta) guarantee"))
    ipc: int = Field(10, ge=1, le=MANY, description=(
        "condensed images per class a client condenses"))
    condense_min_class: int | None = Field(None, ge=1, le=MANY, description=(
        "a class with fewer real images is not condensed nor shipped (its few images would come "
        "out as near-copies); null: ipc"))
    # chosen by measurement (docs/algorithms.md, DCFL)
    condense_iterations: int = Field(1000, ge=1, le=MANY, description=(
        "condensation iterations; paper-grade: DM 20,000, DC/DSA 1,000"))
    condense_lr: float = Field(0.1, gt=0, description=(
        "learning rate on the pixels; the authors (SGD): DM 1.0, DC/DSA 0.1"))
    condense_optimizer: Literal["sgd", "adam"] = Field("adam", description=(
        "the pixels' optimizer; sgd: momentum 0.5, as the authors"))
    condense_batch: int = Field(64, ge=1, le=MANY, description=(
        "real images per class per iteration"))
    dc_outer_loop: int = Field(10, ge=1, le=MANY, description=(
        "dc/dsa: matching steps per iteration"))
    dc_inner_loop: int = Field(50, ge=0, le=MANY, description=(
        "dc/dsa: network steps on the synthetic set between matching steps"))
    dc_net_lr: float = Field(0.01, gt=0, description="dc/dsa: that network's learning rate")
    dsa: bool = Field(True, description="DSA on the local and the condensed training batches")
    dsa_transforms: str = Field(DEFAULT_TRANSFORMS, description=(
        "DSA's transforms, joined by _; digits: drop flip"))
    finetune_epochs: int = Field(1, ge=0, le=MANY, description=(
        "E_s: epochs on the received condensed images"))
    finetune_lr: float = Field(0.005, gt=0, description=(
        "eta_s, kept below lr (eta_c) as the paper asks; 0.005 chosen on Table II's three "
        "Fashion-MNIST columns (docs/results.md)"))
    finetune_batch_size: int = Field(32, ge=1, le=MANY, description="B_s")
    condensed_use: Literal["finetune", "mix"] = Field("finetune", description=(
        "finetune: a stage on the received images after local training; mix: one stage on "
        "local and received images together"))
    finetune_order: Literal["after", "before"] = Field("after", description=(
        "with condensed_use=finetune, the stage on the received images comes after the local "
        "stage (the paper's) or before it"))
    finetune_layers: Literal["all", "head"] = Field("all", description=(
        "what the stage on the received images trains: every layer, or the classifier head "
        "only (the features stay as the local stage leaves them)"))

    @property
    def min_class(self) -> int:
        """The fewest real images a class needs to be condensed."""
        return self.ipc if self.condense_min_class is None else self.condense_min_class

    @model_validator(mode="after")
    def _private_condensation(self):
        if not self.condense_dp:
            return self
        if self.condensation != "dm" or self.condense_init != "noise":
            raise ValueError("condense_dp=true needs condensation=dm and condense_init=noise "
                             "(real-image initialisation ships the images themselves)")
        if (self.condense_dp_noise is None) == (self.condense_dp_epsilon is None):
            raise ValueError("condense_dp=true needs exactly one of condense_dp_noise (sigma) "
                             "and condense_dp_epsilon (a target epsilon)")
        return self

    @field_validator("dsa_transforms")
    @classmethod
    def _known_transforms(cls, value: str) -> str:
        try:
            parse_transforms(value)
        except ConfigError as err:
            raise ValueError(str(err)) from None
        return value


def condensation_settings(section: Mapping[str, Any]) -> CondensationSettings:
    """These fields of an experiment's ``strategy`` section (the rest is the server's)."""
    fields = CondensationSettings.model_fields
    return validated(CondensationSettings, {k: v for k, v in section.items() if k in fields},
                     "strategy.")


@dataclass(frozen=True)
class PrivacyPlan:
    """DP-DM on one client: per held class c, the Poisson sampling rate q_c of its real images
    per iteration (condense_batch / n_c, at most 1), the noise multiplier sigma_c, and the
    epsilon at ``delta`` of all iterations. The class counts n_c are public (the data survey
    discloses them; the rates and the denominator q_c n_c use them), so neighbouring datasets
    keep them: one image replaced by another of its class, accounted by dp-accounting's PLD
    accountant under replace-one. A replacement keeps the label, so it touches one class's
    mechanism only: the classes compose in parallel and the client's epsilon is its worst
    class's. ``default_clip``: ``clip`` is the noise-derived default, not a setting."""

    clip: float | None
    delta: float
    iterations: int
    rates: dict[int, float]
    noise: dict[int, float]
    epsilons: dict[int, float]
    default_clip: bool = False

    @property
    def epsilon(self) -> float:
        return max(self.epsilons.values(), default=0.0)

    def line(self) -> str:
        sigmas = sorted(set(self.noise.values()))
        sigma = (f"{sigmas[0]:.3g}" if len(sigmas) == 1
                 else f"{sigmas[0]:.3g}-{sigmas[-1]:.3g} by class")
        clip = ("unset" if self.clip is None else f"{self.clip:.4g}") + (
            " (median norm of noise images under fresh networks)" if self.default_clip else "")
        return (f"DP-DM (epsilon {self.epsilon:.3g}, delta {self.delta:g}, replace-one): "
                f"{self.iterations} iterations, embeddings clipped to {clip}, noise "
                f"multiplier {sigma}, sampling rates "
                f"{min(self.rates.values()):.3g}-{max(self.rates.values()):.3g}")


def privacy_plan(settings: CondensationSettings, class_counts: Sequence[int],
                 default_clip: float | None = None) -> PrivacyPlan | None:
    """The DP-DM plan for a client holding ``class_counts`` (None without condense_dp): sigma
    as set, or the smallest that keeps each class within condense_dp_epsilon.
    ``default_clip``: the clip when condense_dp_clip is null (the epsilon does not depend on
    it; the server, which prints epsilons only, leaves it out)."""
    if not settings.condense_dp:
        return None
    from driftfl.common.accounting import replace_one_epsilon, replace_one_noise_for_epsilon

    s, rates, noise, epsilons = settings, {}, {}, {}
    for c, n in enumerate(class_counts):
        if n < max(1, s.min_class):  # not condensed: nothing of it is released
            continue
        rates[c] = min(1.0, s.condense_batch / n)
        noise[c] = (s.condense_dp_noise if s.condense_dp_noise is not None else
                    replace_one_noise_for_epsilon(rates[c], s.condense_iterations,
                                                  s.condense_dp_epsilon, s.condense_dp_delta))
        epsilons[c] = replace_one_epsilon(rates[c], noise[c], s.condense_iterations,
                                          s.condense_dp_delta)
    clip = s.condense_dp_clip if s.condense_dp_clip is not None else default_clip
    return PrivacyPlan(clip, s.condense_dp_delta, s.condense_iterations, rates, noise,
                       epsilons, default_clip=s.condense_dp_clip is None)


PIXEL_BOUND = 1e4  # condensed pixels (normalised images) beyond this are not images


def read_condensed(record: ArrayRecord, shape: tuple[int, ...], num_classes: int,
                   ipc: int | None = None) -> tuple[np.ndarray, np.ndarray] | str:
    """(images, labels) of a ``condensed`` record, or why it cannot be used: the server checks
    a client's set with it, a client the images a server sent. ``ipc``: the most images of one
    class (a client's own set; a server's holds many clients')."""
    try:
        images, labels = record["images"].numpy(), record["labels"].numpy()
    except Exception as err:  # missing or unreadable arrays
        return f"condensed set cannot be read: {err!r}"
    n = len(labels) if labels.ndim == 1 else -1  # 0: a client with no class to condense
    if (images.dtype != np.float32 or labels.dtype != np.int64 or n < 0
            or images.shape != (n, *shape)):
        expected = ", ".join(map(str, shape))
        return (f"condensed set is {images.dtype}{list(images.shape)} / "
                f"{labels.dtype}{list(labels.shape)}, expected float32 [N, {expected}] / int64 [N]")
    if not np.isfinite(images).all() or np.abs(images).max(initial=0.0) > PIXEL_BOUND:
        return "condensed images hold NaN/inf or out-of-range values"
    if ((labels < 0) | (labels >= num_classes)).any():
        return f"condensed labels outside 0..{num_classes - 1}"
    per_class = np.bincount(labels, minlength=num_classes)
    if ipc is not None and per_class.max() > ipc:
        return (f"condensed set holds {per_class.max()} images of class "
                f"{per_class.argmax()}, more than ipc = {ipc}")
    return images, labels


class DCFLSettings(StrategySettings, CondensationSettings):
    pretrain_fraction: float = Field(0.25, gt=0, le=1, description=(
        "C_pre: each pre-training request asks max(C_pre * num_clients, 1) clients at random "
        "to condense and train"))
    pretrain_requests: int = Field(2, ge=0, le=MANY, description=(
        "M: the pre-training stage's requests before round 1 (0: no pre-training stage)"))
    pretrain_epochs: int = Field(10, ge=0, le=MANY, description=(
        "the server's epochs on all condensed images"))
    pretrain_lr: float = Field(0.01, gt=0, description=(
        "the learning rate of the server's pre-training epochs"))
    filter_ratio: float = Field(0.2, ge=0, lt=1, description=(
        "r: the share of a group's images with the highest loss dropped"))
    group_size: int | None = Field(None, ge=0, le=MANY, description=(
        "the complementary group's size; null: clients per round - 1"))
    finetune_own_set: bool = Field(False, description=(
        "Algorithm 2 line 13's reading: the client's own condensed set joins the received "
        "images (the server sends it back; it is the client's own data)"))
    cka_of: Literal["update", "weights"] = Field("update", description=(
        "what the CKA compares: the client's classifier update W_k - W_sent, or (driftfl's "
        "earlier reading) the weights W_k, whose common starting point pulls every CKA "
        "towards 1"))


class CKASettings(Settings):
    epsilon: float = Field(0.5, ge=0, le=1, description=(
        "share of the round's clients exploited (drawn by their CKA similarity); the rest are "
        "explored at random"))
