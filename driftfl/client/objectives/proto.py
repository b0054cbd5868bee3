"""FedProto's client (Tan et al., AAAI 2022), as the FedCSD paper compares it: local training
pulls each sample's features h(x) towards its class's global prototype P_G[y],
  L_p = MSE(h(x), P_G[y]), mean over the batch's samples and the feature dimensions, a sample
        whose class has no global prototype contributing 0 but counted in the mean
        (as the authors compute it: such a sample's target is its own, detached, features);
  L = CE + mu * L_p   (mu: the authors' lambda). No global prototypes (round 1): plain CE.
After training the node replies with its prototypes: per-class mean features of the trained
model over all its data (eval mode) and its per-class counts.
Reading: the prototypes are computed after training, on the trained model (as FL-bench and
PFLlib do); the authors' code averages the features of the batches seen during training.
"""

from __future__ import annotations

import numpy as np
import torch

from driftfl.common.protocol import FEATURE_PROTOTYPES
from driftfl.specs import objectives as declared
from driftfl.specs.objectives import ProtoSettings

from .base import Batch, Objective
from .csd import class_prototypes, prototype_record
from .moon import features_of


def proto_loss(features: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor,
               present: torch.Tensor) -> torch.Tensor:
    """L_p: mean over samples and dimensions of (h - P_G[y])^2, zero for samples whose class
    has no global prototype (``present[y]`` false)."""
    held = present[labels].to(features.dtype)[:, None]
    return (held * (features - prototypes[labels].detach()) ** 2).mean()


class Proto(Objective):
    spec = declared.PROTO

    def __init__(self, settings: ProtoSettings, job=None):
        super().__init__(settings, job)
        self.weight = settings.mu
        self.prototypes = self.present = None

    def prepare(self, model, x, y) -> None:
        self.x, self.y = x, y  # for the prototypes after training
        content = self.job.message.content if self.job is not None else {}
        if FEATURE_PROTOTYPES not in content:
            return  # round 1: no global prototypes yet
        record = content[FEATURE_PROTOTYPES]
        prototypes = torch.from_numpy(np.array(record["prototypes"].numpy(), np.float32))
        present = torch.from_numpy(np.array(record["present"].numpy(), bool))
        shape = (model.head.out_features, model.head.in_features)
        if tuple(prototypes.shape) != shape or tuple(present.shape) != shape[:1]:
            raise ValueError(f"global prototypes {tuple(prototypes.shape)} / present "
                             f"{tuple(present.shape)} do not fit the model's (C, d) = {shape}")
        if not torch.isfinite(prototypes[present]).all():
            raise ValueError("global prototypes hold NaN or infinite values")
        self.prototypes, self.present = prototypes.to(x.device), present.to(x.device)

    def term(self, batch: Batch) -> torch.Tensor | None:
        if self.prototypes is None:
            return None
        return proto_loss(batch.features, batch.y, self.prototypes, self.present)

    def after_training(self, model, stats) -> None:
        self.local = class_prototypes(features_of(model, self.x), self.y,
                                      model.head.out_features)

    def diagnostics(self) -> dict[str, float]:
        # how many classes had a global prototype this round (0 in round 1)
        return {"global-prototype-classes":
                0.0 if self.present is None else float(self.present.sum())}

    def reply_records(self) -> dict:
        return {FEATURE_PROTOTYPES: prototype_record(*self.local)}
