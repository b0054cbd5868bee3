"""The methods' own settings (the ``strategy`` section's server half) and declarations: what
each server sends, what its clients run, and what privacy and secure aggregation cannot cover.
driftfl.strategies.methods implements each (one a module named after it; DCFL: driftfl.dcfl,
whose settings are its own), every class taking its declaration's values."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from driftfl.common.protocol import (CLASS_PHI, CONDENSE, CONDENSED, CONTROL, CONTROL_DELTA,
                                     CREDIBILITY, EXPLORED_CLIENTS, FEATURE_PROTOTYPES,
                                     FISHER_DELTA, FISHER_PENALTY, PROTOTYPES, PROXIMAL_MU,
                                     TEACHER)
from driftfl.common.settings import MANY, StrategySettings
from driftfl.dcfl.settings import DCFLSettings
from driftfl.specs.base import MethodSpec, declare_method


class FedAvgMSettings(StrategySettings):
    server_lr: float = Field(1.0, ge=0, description="eta_s: the server's learning rate")
    server_momentum: float = Field(0.9, ge=0, lt=1, description="beta: the server's momentum")


class AuxSetSettings(StrategySettings):
    """For strategies that keep an aux set: how many samples of each class it holds."""

    aux_per_class: int = Field(64, ge=1, le=MANY, description=(
        "the server's aux set: training samples of each class held back from every client"))

    def aux_set_per_class(self) -> int:
        return self.aux_per_class


class FedCADSettings(AuxSetSettings):
    alpha_source: Literal["local", "aux"] = Field("local", description=(
        "where E_{x|y}[phi] is estimated: local, on each client's data; aux, on the server's "
        "aux set"))

    def aux_set_per_class(self) -> int:
        return self.aux_per_class if self.alpha_source == "aux" else 0


class FedCSDSettings(StrategySettings):
    alpha: float = Field(0.9, ge=0, lt=1, description=(
        "teacher momentum (TMA): teacher <- alpha teacher + (1 - alpha) global"))
    tma: bool = Field(True, description=(
        "false: the teacher is the last global model (alpha = 0)"))


class FedGKDSettings(StrategySettings):
    buffer_size: int = Field(5, ge=1, le=MANY, description=(
        "M: the teacher is the parameter average of the last M global models"))


class FedProtoSettings(StrategySettings):
    prototype_mean: Literal["weighted", "plain"] = Field("weighted", description=(
        "P_G,c: weighted by the holders' counts of c (docs/algorithms.md); plain: their plain "
        "mean (the authors' code)"))


def csd_protection_problem(settings: FedCSDSettings) -> str | None:
    if settings.prototypes == "exchange":
        return ("strategy.prototypes=exchange runs a prototype phase before training, a "
                "second exchange each round that neither covers; set "
                "strategy.prototypes=previous (the prototypes ride in the train reply, "
                "covered with the update) or local (none are sent)")
    return None


def proto_protection_problem(settings: FedProtoSettings) -> str | None:
    if settings.prototype_mean == "weighted":
        return ("strategy.prototype_mean=weighted weighs each client's prototypes by its "
                "own class counts, which noise for one clipped client does not cover and "
                "SecAgg+'s one weight per client cannot carry; set "
                "strategy.prototype_mean=plain (each holder counts once, as in the "
                "authors' code)")
    return None


# no server state of their own: the objective is the method (FedNova's and FedDisco's yaml
# choose their aggregation, each a part)
FEDAVG = declare_method(MethodSpec("fedavg"), variants={
    "fedlsd": "lsd", "fedntd": "ntd", "moon": "moon", "fednova": "ce", "feddisco": "ce"})
FEDAVGM = declare_method(MethodSpec("fedavgm", FedAvgMSettings))
FEDPROX = declare_method(MethodSpec("fedprox", objective="prox",
                                    provides=frozenset({PROXIMAL_MU})))
SCAFFOLD = declare_method(MethodSpec(
    "scaffold", objective="scaffold", objective_fixed=True,  # its update assumes its clients'
    provides=frozenset({CONTROL}), payload_record=CONTROL_DELTA, payload_clip=0.3))
FEDDYN = declare_method(MethodSpec(
    "feddyn", objective="dyn", objective_fixed=True,
    unprotected="its h, a running sum of every client's own unclipped model"))
FEDCURV = declare_method(MethodSpec(
    "fedcurv", objective="curv", provides=frozenset({FISHER_PENALTY}),
    payload_record=FISHER_DELTA,  # under privacy or secagg
    payload_clip=1.0))
FEDPROTO = declare_method(MethodSpec(
    "fedproto", FedProtoSettings, objective="proto", provides=frozenset({FEATURE_PROTOTYPES}),
    payload_record=FEATURE_PROTOTYPES, payload_clip=10.0,
    protection_problem=proto_protection_problem))
FEDGKD = declare_method(MethodSpec("fedgkd", FedGKDSettings, objective="gkd",
                                   provides=frozenset({TEACHER})))
FEDCSD = declare_method(MethodSpec(
    "fedcsd", FedCSDSettings, objective="csd", provides=frozenset({TEACHER, PROTOTYPES}),
    payload_record=PROTOTYPES,  # with prototypes=previous
    payload_clip=5.0, protection_problem=csd_protection_problem))
FEDSSD = declare_method(MethodSpec("fedssd", AuxSetSettings, objective="ssd",
                                   provides=frozenset({CREDIBILITY})))
FEDCAD = declare_method(MethodSpec("fedcad", FedCADSettings, objective="cad",
                                   provides=frozenset({CLASS_PHI})))
DCFL = declare_method(MethodSpec(
    "dcfl", DCFLSettings, provides=frozenset({EXPLORED_CLIENTS, CONDENSE, CONDENSED,
                                              PROXIMAL_MU}),
    unprotected="its clients' condensed images and classifier heads",
    step_budget="a step budget over DCFL's two training stages is not defined"))
