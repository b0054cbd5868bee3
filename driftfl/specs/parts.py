"""The parts' settings and declarations: each selection and aggregation by the name its
config group takes (conf/selection/, conf/aggregation/), with what it needs of the strategy
and of each client's update, and the robust rules' check of the round size
(driftfl.strategies.parts implements each; DCFL's CKA selection: driftfl.dcfl, whose
settings are its own)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field

from driftfl.common.errors import ConfigError
from driftfl.common.protocol import EXPLORED_CLIENTS
from driftfl.common.settings import MANY, Settings
from driftfl.dcfl.settings import CKASettings
from driftfl.specs.base import PartSpec


class FedDiscoSettings(Settings):
    a: float = Field(0.5, ge=0, description="weight of the discrepancy d_k")
    b: float = Field(0.1, description="offset added before the ReLU")
    metric: Literal["l2", "kl"] = Field("l2", description=(
        "d_k: ||D_k - U||_2 (l2), or the authors' scripts' KL"))


class TrimmedMeanSettings(Settings):
    beta: float = Field(0.2, ge=0, lt=0.5, description=(
        "share of the replies cut at each end, per coordinate (0: the plain unweighted mean)"))


class KrumSettings(Settings):
    num_malicious: int = Field(0, ge=0, le=MANY, description=(
        "f: the bad replies tolerated; a round needs n > 2f + 2 replies"))
    num_selected: int = Field(1, ge=1, le=MANY, description=(
        "m: the replies kept and averaged; 1 is Krum, more is Multi-Krum"))


def replies_per_round(cfg) -> int:
    """Clients that train in a round when all nodes are up (DriftStrategy.train_count)."""
    return max(1, math.floor(cfg.num_clients * cfg.fraction + 1e-9))


def trimmed_mean_too_few(beta: float, n: int) -> str | None:
    """Why the trimmed mean cannot aggregate n replies (None: it can)."""
    if beta > 0 and int(beta * n) == 0:
        return (f"beta={beta} cuts int({beta} * {n}) = 0 of {n} replies at each end; it needs "
                f"at least {math.ceil(1 / beta - 1e-9)}")
    return None


def krum_too_few(num_malicious: int, n: int) -> str | None:
    """Why Krum cannot aggregate n replies (None: it can)."""
    if n <= 2 * num_malicious + 2:
        return (f"Krum with num_malicious={num_malicious} needs more than "
                f"{2 * num_malicious + 2} replies, got {n}")
    return None


def krum_planned(num_malicious: int, num_selected: int, n: int) -> str | None:
    """Why n replies per round cannot be Krum's plan (None: they can)."""
    if num_selected > n - num_malicious and not krum_too_few(num_malicious, n):
        return (f"num_selected={num_selected} is more than the n - num_malicious = "
                f"{n - num_malicious} replies that may all be good")
    return krum_too_few(num_malicious, n)


def round_size_check(name: str, planned: Callable[[Any, int], str | None]):
    """A robust rule's check: refuse the experiment whose round size the rule cannot serve."""
    def check(cfg) -> None:
        n = replies_per_round(cfg)
        problem = planned(cfg.aggregation, n)
        if problem:
            raise ConfigError(f"aggregation={name} cannot work with the {n} clients per round "
                              f"that num_clients * fraction gives: {problem}")
    return check


AGGREGATIONS: dict[str, PartSpec] = {spec.name: spec for spec in (
    PartSpec("mean"),
    PartSpec("fednova", individual="FedNova normalises each client's update by its own step "
                                   "count"),
    PartSpec("feddisco", FedDiscoSettings, individual="FedDisco reweighs each client's "
                                                      "individual update by its label "
                                                      "discrepancy"),
    PartSpec("median", individual="the coordinate-wise median needs every client's "
                                  "individual update"),
    PartSpec("trimmed_mean", TrimmedMeanSettings,
             individual="the trimmed mean sorts every client's individual update",
             check=round_size_check("trimmed_mean",
                                    lambda s, n: trimmed_mean_too_few(s.beta, n))),
    PartSpec("krum", KrumSettings, individual="Krum scores every client's individual update",
             check=round_size_check("krum", lambda s, n: krum_planned(
                 s.num_malicious, s.num_selected, n))))}
SELECTIONS: dict[str, PartSpec] = {
    "uniform": PartSpec("uniform"),
    "cka": PartSpec("cka", CKASettings, needs=frozenset({EXPLORED_CLIENTS}))}  # DCFL's
