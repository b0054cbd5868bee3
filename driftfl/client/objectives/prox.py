"""FedProx: L = CE + mu * 1/2 ||w - w_G||^2, w_G the global weights the round started from.

mu is declared here; the server's FedProx (Flower's) sends it as ``proximal-mu`` with every
train message, and that is the value a client uses: one value, one path.
"""

from __future__ import annotations

import torch

from driftfl.common.protocol import CONFIG, PROXIMAL_MU
from driftfl.common.settings import validated
from driftfl.specs import objectives as declared
from driftfl.specs.objectives import ProxSettings

from .base import Batch, Objective


class Prox(Objective):
    spec = declared.PROX

    def __init__(self, settings: ProxSettings, job=None):
        super().__init__(settings, job)
        self.weight = settings.mu

    @classmethod
    def settings_from(cls, section, job=None) -> ProxSettings:
        if job is None:  # no message: the section's own mu (unit tests)
            return super().settings_from(section)
        return validated(ProxSettings, {"mu": job.message.content[CONFIG][PROXIMAL_MU]})

    def prepare(self, model, x, y) -> None:
        self.trained = [p for p in model.parameters() if p.requires_grad]
        self.anchor = [p.detach().clone() for p in self.trained]

    def term(self, batch: Batch) -> torch.Tensor:
        return 0.5 * sum((p - a).pow(2).sum() for p, a in zip(self.trained, self.anchor))
