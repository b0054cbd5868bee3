"""The local objectives' settings and declarations (driftfl.client.objectives implements each,
one a module named after it): the ``strategy`` section's client half, and what each needs its
server to send."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from driftfl.common.protocol import (
    CONTROL,
    CREDIBILITY,
    FEATURE_PROTOTYPES,
    FISHER_PENALTY,
    PROTOTYPES,
    PROXIMAL_MU,
    TEACHER,
)
from driftfl.common.settings import Settings
from driftfl.specs.base import ObjectiveSpec, declare_objective


class CADSettings(Settings):
    gamma_min: float = Field(0.25, ge=0, le=1, description=(
        "alpha_y's floor (the paper's beta): the distillation weight of a class the global "
        "model knows worst"))
    gamma_max: float = Field(0.5, ge=0, le=1, description=(
        "alpha_y's ceiling (the paper's gamma): the distillation weight of a class the global "
        "model knows best; at least gamma_min"))
    temperature: float = Field(1.0, gt=0, description=(
        "T: the distillation temperature of softmax_T(z_g) and softmax_T(z)"))

    @field_validator("gamma_max")
    @classmethod
    def _at_least_gamma_min(cls, value, info):
        low = info.data.get("gamma_min")
        if low is not None and value < low:
            raise ValueError(f"must be >= gamma_min ({low})")
        return value


class CSDSettings(Settings):
    mu: float = Field(0.001, ge=0, description="weight of L_CSD")
    tau: float = Field(10.0, gt=0, description="distillation temperature")
    similarity: bool = Field(True, description=(
        "weight the teacher's logits by softmax(cos(z, P_G,c)); false: plain teacher logits"))
    mask: Literal["adaptive", "forcible", "off"] = Field("adaptive", description=(
        "which samples are distilled: adaptive keeps those whose p_teacher(y) > 1/|Y|, "
        "forcible those whose argmax is y, off all"))
    prototypes: Literal["exchange", "previous", "local"] = Field("exchange", description=(
        "where P comes from: exchange (a prototype phase before training each round, the "
        "paper), previous (the previous round's P_G, one exchange a round), local (each "
        "client's own, from the teacher's logits: the authors' code)"))
    combination: Literal["sum", "convex"] = Field("sum", description=(
        "sum: CE + mu L_CSD (the paper); convex: (1 - mu) CE + mu L_CSD"))
    mask_on: Literal["teacher", "refined"] = Field("teacher", description=(
        "the mask is taken on softmax(z_t) (teacher, the paper) or softmax(z_hat) (refined)"))
    divergence: Literal["cross_entropy", "kl"] = Field("cross_entropy", description=(
        "soft cross-entropy (the paper) or KL(q_t || q)"))
    detach_similarity: bool = Field(True, description=(
        "the similarity weights are a target (the paper's reading); false: the gradient flows "
        "through them (the authors' code)"))


class CurvSettings(Settings):
    lam: float = Field(1.0, ge=0, description=(
        "weight of the Fisher penalty (FedNTD's reference config)"))


class DynSettings(Settings):
    alpha: float = Field(0.1, ge=0, description=(
        "weight of the quadratic term and of the state update (FedNTD's reference dyn_alpha); "
        "0: FedAvg exactly"))


class GKDSettings(Settings):
    gamma: float = Field(0.2, ge=0, description=(
        "the distillation term's weight is gamma / 2 (the FedGKD paper's 0.2)"))
    tau: float = Field(1.0, gt=0, description="distillation temperature")


class LSDSettings(Settings):
    beta: float = Field(0.3, ge=0, le=1, description=(
        "weight of the distillation term L_d; 1 - beta weighs CE"))
    temperature: float = Field(1.0, gt=0, description=(
        "T: the distillation temperature of softmax_T(z_g) and softmax_T(z)"))


class MoonSettings(Settings):
    mu: float = Field(1.0, ge=0, description=(
        "weight of the contrastive term L_con (the MOON paper tunes it in {0.1, 1, 5, 10})"))
    tau: float = Field(0.5, gt=0, description="temperature of the cosine similarities")


class NTDSettings(Settings):
    beta: float = Field(1.0, ge=0, description="weight of the not-true distillation term")
    tau: float = Field(1.0, gt=0, description="distillation temperature")


class ProtoSettings(Settings):
    mu: float = Field(1.0, ge=0, description=(
        "weight of the prototype term L_p (FedProto's lambda)"))


class ProxSettings(Settings):
    mu: float = Field(0.01, ge=0, description=(
        "weight of the proximal term (the papers use 0.001 or 0.01)"))


class ScaffoldSettings(Settings):
    divisor: Literal["effective", "steps"] = Field("effective", description=(
        "a_k in c_k+ = c_k - c + (w_G - w_k) / (a_k lr): effective, FedNova's momentum-aware "
        "step count (tau_k without momentum; FedNTD's code); steps, tau_k always (the paper's "
        "formula)"))


class SSDSettings(Settings):
    lam: float | None = Field(None, ge=0, description=(
        "upper bound of every distillation weight; null: 0.1 / the number of classes"))
    psi: Literal["sqrt", "identity"] = Field("sqrt", description=(
        "sample credibility psi(p_g,y): sqrt (1 - sqrt(1 - p)) or identity"))
    distill_loss: Literal["selective", "mse", "kl"] = Field("selective", description=(
        "selective (FedSSD); mse or kl: a constant weight lam (the ablation)"))

    def for_classes(self, num_classes: int) -> SSDSettings:
        return self if self.lam is not None else self.model_copy(update={"lam": 0.1 / num_classes})


CE = declare_objective(ObjectiveSpec("ce"))  # plain cross-entropy
CAD = declare_objective(ObjectiveSpec("cad", CADSettings))
CSD = declare_objective(ObjectiveSpec("csd", CSDSettings, needs=frozenset({TEACHER, PROTOTYPES})))
CURV = declare_objective(ObjectiveSpec("curv", CurvSettings, needs=frozenset({FISHER_PENALTY})))
DYN = declare_objective(ObjectiveSpec("dyn", DynSettings))
GKD = declare_objective(ObjectiveSpec("gkd", GKDSettings, needs=frozenset({TEACHER})))
LSD = declare_objective(ObjectiveSpec("lsd", LSDSettings))
MOON = declare_objective(ObjectiveSpec("moon", MoonSettings))
NTD = declare_objective(ObjectiveSpec("ntd", NTDSettings))
PROTO = declare_objective(ObjectiveSpec(
    "proto", ProtoSettings, needs=frozenset({FEATURE_PROTOTYPES})))
PROX = declare_objective(ObjectiveSpec("prox", ProxSettings, needs=frozenset({PROXIMAL_MU})))
SCAFFOLD = declare_objective(ObjectiveSpec(
    "scaffold", ScaffoldSettings, needs=frozenset({CONTROL})))
SSD = declare_objective(ObjectiveSpec("ssd", SSDSettings, needs=frozenset({CREDIBILITY})))
