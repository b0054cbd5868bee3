"""MOON: model-contrastive federated learning (Li, He and Song, CVPR 2021).

With r = the model's representation (``model.features``; with ``model.projection=n`` that is
MOON's projection head), r_glob that of the received global model and r_prev that of this node's
previous local model (the one it trained last time; on its first round the global model):
  l = -log( e^{cos(r, r_glob)/tau} / (e^{cos(r, r_glob)/tau} + e^{cos(r, r_prev)/tau}) ) per sample,
  L = CE + mu * L_con,  L_con = batch mean of l.
Both r_glob and r_prev come from frozen models and the inputs are not augmented, so they are
computed once before training (eval mode, no gradient) on all local data and looked up per batch.
After training the node keeps its trained model (all arrays) in ``context.state`` for next time.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from driftfl.client.state import keep, recall
from driftfl.common.evaluation import forward_batch_size
from driftfl.specs import objectives as declared
from driftfl.specs.objectives import MoonSettings

from .base import Batch, Objective

STATE_PREVIOUS = "moon.previous-model"


@torch.no_grad()
def features_of(model: nn.Module, x: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
    """``model.features`` on all of ``x`` in eval mode; the model's mode is restored after."""
    batch_size = batch_size or forward_batch_size(x)
    was_training = model.training
    model.eval()
    out = [model.features(x[i:i + batch_size]) for i in range(0, len(x), batch_size)]
    model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0, 0, device=x.device)


def moon_contrastive(r: torch.Tensor, r_glob: torch.Tensor, r_prev: torch.Tensor,
                     tau: float) -> torch.Tensor:
    """L_con, batch mean: cross-entropy of the pair (cos(r, r_glob), cos(r, r_prev)) / tau
    towards the first (the global model's representation is the positive)."""
    positive = F.cosine_similarity(r, r_glob.detach(), dim=1)
    negative = F.cosine_similarity(r, r_prev.detach(), dim=1)
    pair = torch.stack([positive, negative], dim=1) / tau
    return -F.log_softmax(pair, dim=1)[:, 0].mean()


def previous_model(model: nn.Module, stored: dict[str, torch.Tensor] | None) -> nn.Module | None:
    """A copy of ``model`` holding the stored arrays (None if none, or if they do not fit it)."""
    if stored is None:
        return None
    own = model.state_dict()
    if set(stored) != set(own) or any(stored[k].shape != v.shape for k, v in own.items()):
        return None  # another architecture: fall back to the global model
    previous = copy.deepcopy(model)
    previous.load_state_dict(stored)
    return previous


class Moon(Objective):
    spec = declared.MOON

    def __init__(self, settings: MoonSettings, job=None):
        super().__init__(settings, job)
        self.weight = settings.mu
        self.used_previous = False

    def prepare(self, model, x, y) -> None:
        self.r_glob = features_of(model, x)  # the model still holds the global weights
        stored = recall(self.job.context, STATE_PREVIOUS, x.device) if self.job else None
        previous = previous_model(model, stored)
        self.used_previous = previous is not None
        self.r_prev = features_of(previous, x) if previous is not None else self.r_glob

    def term(self, batch: Batch) -> torch.Tensor:
        return moon_contrastive(batch.features, self.r_glob[batch.index],
                                self.r_prev[batch.index], self.settings.tau)

    def after_training(self, model, stats) -> None:
        if self.job is not None:  # the next round's r_prev
            keep(self.job.context, STATE_PREVIOUS, model.state_dict())

    def diagnostics(self) -> dict[str, float]:
        # 1: this round's negatives came from the node's previous local model; 0: from the
        # global model (the node's first round, or a stored model that did not fit)
        return {"moon-previous-model": float(self.used_previous)}
