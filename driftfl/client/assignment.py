"""What the server asked this node to do beyond the experiment's settings: its local epochs
and step budget this round (heterogeneity=), and whether to measure its held-out split before
and after training (client_test_fraction). Read from the train message's ``assignment`` record;
without one the node trains as the experiment says and measures nothing."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from driftfl.common.conditions import (ASSIGNED_EPOCHS, ASSIGNED_MAX_STEPS, ASSIGNMENT,
                                       EVALUATE_CLIENT)
from driftfl.common.evaluation import evaluate
from driftfl.common.training import TrainSettings

from .job import ClientJob


def _assignment(job: ClientJob) -> dict:
    records = job.message.content.config_records
    return dict(records[ASSIGNMENT]) if ASSIGNMENT in records else {}


def local_stage(job: ClientJob) -> TrainSettings:
    """The experiment's local training with the epochs and step budget assigned to this node."""
    settings, assigned = TrainSettings.local_stage(job.experiment), _assignment(job)
    if ASSIGNED_EPOCHS in assigned:
        settings = replace(settings, epochs=int(assigned[ASSIGNED_EPOCHS]))
    if int(assigned.get(ASSIGNED_MAX_STEPS, 0)) > 0:
        settings = replace(settings, max_steps=int(assigned[ASSIGNED_MAX_STEPS]))
    return settings


def evaluates(job: ClientJob) -> bool:
    """Whether the server asked for this round's per-client evaluation (and there is a split)."""
    return bool(_assignment(job).get(EVALUATE_CLIENT, 0)) and job.data.test_y is not None


def held_out_accuracy(job: ClientJob, model: nn.Module) -> float:
    """The model's accuracy on this node's held-out split."""
    x, y = job.data.test_x.to(job.device), job.data.test_y.to(job.device)
    return evaluate(model, x, y, job.experiment.eval_batch_size, job.num_classes)[1]
