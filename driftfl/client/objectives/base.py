"""What an objective is: the local loss of one method, given a batch's features and logits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from driftfl.common.errors import lookup
from driftfl.common.settings import NoSettings, Settings, validated
from driftfl.common.training import Batch, TrainStats  # noqa: F401  (objectives import them here)
from driftfl.specs import ObjectiveSpec, declare_objective
from driftfl.specs import objectives as declared

if TYPE_CHECKING:
    from driftfl.client.job import ClientJob

# every objective by the name a train message's ``method`` key carries; a subclass that sets
# ``name`` registers itself here
OBJECTIVES: dict[str, type[Objective]] = {}


class Objective:
    """Plain cross-entropy, FedAvg's local objective; every method refines it.

    A method (1) prepares from the received knowledge before the first epoch (``prepare``),
    (2) returns the batch loss (``loss``; most add ``weight * term`` to the cross-entropy),
    (3) may report diagnostics that travel back in the reply's metrics. It declares its
    settings once (``Settings``, read from the experiment's ``strategy`` section) and the
    records or config keys it ``needs`` from the server's strategy: the built-ins in their
    declaration (``spec``, driftfl.specs.objectives: checked before torch loads), an objective
    of one's own on its class (``name``, ``Settings``, ``needs``).
    """

    spec: ClassVar[ObjectiveSpec] = declared.CE
    name: ClassVar[str] = "ce"
    Settings: ClassVar[type[Settings]] = NoSettings
    needs: ClassVar[frozenset[str]] = frozenset()
    weight: float = 0.0

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("spec")
        if spec is None and "name" in cls.__dict__:  # declared on its class alone
            spec = declare_objective(ObjectiveSpec(cls.name, cls.Settings, cls.needs))
        if spec is not None:
            cls.name, cls.Settings, cls.needs = spec.name, spec.Settings, spec.needs
            OBJECTIVES[spec.name] = cls

    def __init__(self, settings: Settings, job: ClientJob | None = None):
        self.settings = settings
        self.job = job  # the message, its records, the node's context (None in unit tests)

    @classmethod
    def settings_from(cls, section: Mapping[str, Any], job: ClientJob | None = None) -> Settings:
        """This objective's settings, from the experiment's ``strategy`` section (which also
        holds the strategy's settings, and is checked whole on the server)."""
        return validated(cls.Settings, {k: v for k, v in section.items()
                                        if k in cls.Settings.model_fields}, "strategy.")

    def prepare(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        """Called once before local training, with the model holding the global weights."""

    def term(self, batch: Batch) -> torch.Tensor | None:
        """The method's regulariser for a batch; None for none."""
        return None

    def loss(self, batch: Batch) -> torch.Tensor:
        ce = F.cross_entropy(batch.logits, batch.y)
        term = self.term(batch)
        return ce if term is None else ce + self.weight * term

    def before_step(self, model: nn.Module) -> None:
        """Called after each backward pass, before the optimizer's step: a method may correct
        the gradients here (SCAFFOLD adds c - c_k)."""

    def after_training(self, model: nn.Module, stats: TrainStats) -> None:
        """Called once after local training, with the trained model and the loop's counts:
        update the node's state (SCAFFOLD's c_k, MOON's previous model) or measure what the
        reply carries (FedProto's prototypes)."""

    def diagnostics(self) -> dict[str, float]:
        return {}

    def reply_records(self) -> dict:
        """Further named records for the train reply (statistics the server aggregates)."""
        return {}


OBJECTIVES[Objective.name] = Objective


def build_objective(name: str, section: Mapping[str, Any] | Settings,
                    job: ClientJob | None = None) -> Objective:
    """The objective ``name`` with its settings from ``section`` (a mapping such as the
    experiment's ``strategy`` section, or settings already built)."""
    cls = lookup("objective", name, OBJECTIVES)
    if isinstance(section, cls.Settings):
        return cls(section, job)
    data = section.model_dump() if isinstance(section, Settings) else section
    return cls(cls.settings_from(data, job), job)
