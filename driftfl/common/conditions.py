"""The simulated clients' systems heterogeneity (``heterogeneity=``): unequal local work,
stragglers and dropout, drawn from the experiment seed.

- ``epochs``: each selected client trains E epochs, E drawn uniformly from
  [min_epochs, max_epochs] per client and round (FedNova's setting, Wang et al. 2020), or once
  per client for the whole run (``per_round: false``).
- ``stragglers``: a share of the round's selected clients has a step budget, ``step_budget`` of
  the steps its epochs would take (at least one): with ``stragglers: partial`` it sends the
  work it did (FedNova's normalisation then matters), with ``drop`` the server drops it.
- ``dropout``: a share of the round's selected clients sends nothing that round; the server goes
  on with the others, as it does for a lost node.

The server draws every assignment (it knows what it asked each client to do, so a reply's
``local-steps`` is checked against exactly that) and tells each client its own in the
``assignment`` record of the train message; nothing is drawn on the clients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from .settings import MANY, Settings, changed

ASSIGNMENT = "assignment"  # the per-node ConfigRecord of a train message
ASSIGNED_EPOCHS = "local-epochs"  # this round's local epochs for this node
ASSIGNED_MAX_STEPS = "max-steps"  # a straggler's step budget (0: none)
EVALUATE_CLIENT = "client-eval"  # 1: measure the held-out split before and after training

# SeedSequence keys' last entries: each draw its own stream
EPOCHS_PURPOSE, SHARE_PURPOSE = 11, 12

OWN_FIELDS = {"none": set(), "epochs": {"min_epochs", "max_epochs", "per_round"},
              "stragglers": {"share", "step_budget", "stragglers"}, "dropout": {"share"}}


class HeterogeneitySettings(Settings):
    name: Literal["none", "epochs", "stragglers", "dropout"] = "none"
    min_epochs: int = Field(1, ge=1, le=MANY, description=(
        "epochs: the fewest local epochs a selected client's E is drawn from"))
    max_epochs: int = Field(5, ge=1, le=MANY, description=(
        "epochs: the most local epochs a selected client's E is drawn from"))
    per_round: bool = Field(True, description=(
        "epochs: E drawn per client and round; false: once per client"))
    share: float = Field(0.2, ge=0, lt=1, description=(
        "stragglers, dropout: the share of the round's selected clients that straggle or send "
        "nothing"))
    step_budget: float = Field(0.5, gt=0, le=1, description=(
        "stragglers: the share of the steps their epochs take that they may take (at least "
        "one)"))
    stragglers: Literal["partial", "drop"] = Field("partial", description=(
        "stragglers: send the partial work (partial), or be dropped by the server (drop)"))

    @model_validator(mode="after")
    def _coherent(self):
        stray = [key for key in changed(self) if key not in OWN_FIELDS[self.name]]
        if stray:
            raise ValueError(f"heterogeneity.{stray[0]} means nothing with "
                             f"heterogeneity={self.name}; valid there: "
                             f"{', '.join(sorted(OWN_FIELDS[self.name])) or 'none'}")
        if self.min_epochs > self.max_epochs:
            raise ValueError(f"heterogeneity.min_epochs={self.min_epochs} exceeds "
                             f"heterogeneity.max_epochs={self.max_epochs}")
        return self

    @property
    def enabled(self) -> bool:
        return self.name != "none"


@dataclass(frozen=True)
class Assignment:
    epochs: int  # local epochs this round
    budget: float | None = None  # a straggler's share of its steps (None: all of them)
    dropped: bool = False  # sends nothing this round

    def max_steps(self, full_steps: int) -> int | None:
        """The steps a straggler may take of the ``full_steps`` its epochs make (at least 1)."""
        if self.budget is None:
            return None
        return max(1, math.floor(self.budget * full_steps))


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(list(key)))


def drawn_epochs(settings: HeterogeneitySettings, seed: int, server_round: int,
                 partition: int, local_epochs: int) -> int:
    """Client ``partition``'s epochs in ``server_round`` (local_epochs unless heterogeneity=
    epochs); per_round false: the same in every round."""
    if settings.name != "epochs":
        return local_epochs
    key_round = server_round if settings.per_round else 0
    rng = _rng(seed, key_round, partition + 1, EPOCHS_PURPOSE)
    return int(rng.integers(settings.min_epochs, settings.max_epochs + 1))


def chosen_share(settings: HeterogeneitySettings, seed: int, server_round: int,
                 partitions: list[int]) -> set[int]:
    """The partitions, among the round's selected ones, that straggle or drop out:
    round(share x selected) of them, drawn from the seed and the round."""
    if settings.name not in ("stragglers", "dropout"):
        return set()
    count = round(settings.share * len(partitions))
    order = _rng(seed, server_round, 0, SHARE_PURPOSE).permutation(sorted(partitions))
    return {int(p) for p in order[:count]}


def assignments(settings: HeterogeneitySettings, seed: int, server_round: int,
                partitions: list[int], local_epochs: int) -> dict[int, Assignment]:
    """Every selected partition's assignment for ``server_round``."""
    chosen = chosen_share(settings, seed, server_round, partitions)
    out = {}
    for p in partitions:
        epochs = drawn_epochs(settings, seed, server_round, p, local_epochs)
        if p not in chosen:
            out[p] = Assignment(epochs)
        elif settings.name == "dropout" or settings.stragglers == "drop":
            out[p] = Assignment(epochs, dropped=True)
        else:
            out[p] = Assignment(epochs, budget=settings.step_budget)
    return out
