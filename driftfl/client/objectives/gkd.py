"""FedGKD: distil the mean of the last M global models (the server's ``teacher`` record):
L_reg = (gamma / 2) tau^2 KL(softmax_tau(z_teacher) || softmax_tau(z)), batch mean. Round 1 sends
no teacher (it would be the initial model), so there is no distillation in round 1."""

from __future__ import annotations

from driftfl.common.protocol import TEACHER

from .distill import Distillation, kl_to_teacher


def gkd_term(logits, teacher_logits, tau: float):
    return tau ** 2 * kl_to_teacher(logits, teacher_logits.detach(), tau).mean()


class GKD(Distillation):
    teacher_record = TEACHER

    def __init__(self, params, job=None):
        super().__init__(params, job)
        self.weight = float(params["gamma"]) / 2

    def term(self, batch):
        if self.teacher_logits is None:
            return None
        return gkd_term(batch.logits, self.teacher(batch), float(self.params["tau"]))
