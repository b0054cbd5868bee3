"""FedGKD: distil the mean of the last M global models (the server's ``teacher`` record):
L_reg = (gamma / 2) tau^2 KL(softmax_tau(z_teacher) || softmax_tau(z)), batch mean. Round 1 sends
no teacher (it would be the initial model), so there is no distillation in round 1."""

from __future__ import annotations

from driftfl.common.protocol import TEACHER
from driftfl.specs import objectives as declared
from driftfl.specs.objectives import GKDSettings

from .distill import Distillation, kl_to_teacher


def gkd_term(logits, teacher_logits, tau: float):
    return tau ** 2 * kl_to_teacher(logits, teacher_logits.detach(), tau).mean()


class GKD(Distillation):
    spec = declared.GKD
    teacher_record = TEACHER

    def __init__(self, settings: GKDSettings, job=None):
        super().__init__(settings, job)
        self.weight = settings.gamma / 2

    def term(self, batch):
        if self.teacher_logits is None:
            return None
        return gkd_term(batch.logits, self.teacher(batch), self.settings.tau)
