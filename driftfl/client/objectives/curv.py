"""FedCurv (Shoham et al. 2019): keep each parameter where the other clients' data found it
important, weighting by their diagonal Fisher information.

Client k trains L = CE + lam * sum_i [ P_i w_i^2 - 2 Q_i w_i ], where the server sends
P = sum_{j != k} F_j and Q = sum_{j != k} F_j * w_j (the other clients' latest terms; the server
leaves k's own out, so the node needs no state of its own). Up to a constant that is
lam * sum_j sum_i F_j,i (w_i - w_j,i)^2: an elastic pull towards each other client's model.
After training the client replies F_k, its diagonal Fisher at its trained model w_k.
Reading (docs/algorithms.md): F_k is the mean over the local data's minibatches (in order, the
experiment's batch size) of the squared minibatch gradient of the cross-entropy, as the FedNTD
and OpenFL code compute it; the server forms F_k * w_k itself from the reply's checked model.

Where the server takes the payload as a sum (DP, secure aggregation: the train message says
``summed-payload``) it holds only the totals over every node's latest summed terms
(strategies/fedcurv.py), so the node keeps the terms the totals hold of it (``SUMMED_STATE``)
and takes them out itself: P = totals_F - F_kept, Q = totals_G - G_kept (where noise leaves
P <= 0, both are 0: a negative curvature would push the weights away). It replies the change of
its terms, (F_k - F_kept, F_k w_k - G_kept), clipped as the sum will clip it (DP's
payload_clip), and keeps kept + that change as pending; the next train message's
"included-round" says whether the totals took it.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord

from driftfl.common.privacy import clip_update
from driftfl.common.protocol import (
    CONFIG,
    FISHER,
    FISHER_DELTA,
    FISHER_PENALTY,
    INCLUDED_ROUND,
    SUMMED_PAYLOAD,
)
from driftfl.specs import objectives as declared
from driftfl.specs.objectives import CurvSettings

from ..privacy import payload_clip
from ..state import keep, recall
from .base import Batch, Objective

SUMMED_STATE, PENDING_STATE = "curv.summed", "curv.pending"  # "F.<param>", "G.<param>", round


def curvature_penalty(params: dict[str, torch.Tensor], penalty: dict[str, torch.Tensor],
                      anchor: dict[str, torch.Tensor]) -> torch.Tensor:
    """sum_i [ P_i w_i^2 - 2 Q_i w_i ] over every parameter tensor."""
    return sum(((penalty[k] * p.pow(2)) - 2 * anchor[k] * p).sum() for k, p in params.items())


def diagonal_fisher(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                    batch_size: int) -> dict[str, torch.Tensor]:
    """Mean over the minibatches of (x, y), in order, of the squared minibatch gradient of the
    cross-entropy, per trainable parameter (model in eval mode; its mode is restored)."""
    params = {k: p for k, p in model.named_parameters() if p.requires_grad}
    sums = {k: torch.zeros_like(p) for k, p in params.items()}
    was_training = model.training
    model.eval()
    count = 0
    for start in range(0, len(y), batch_size):
        loss = F.cross_entropy(model(x[start:start + batch_size]), y[start:start + batch_size])
        grads = torch.autograd.grad(loss, list(params.values()))
        for key, g in zip(params, grads):
            sums[key] += g.detach().pow(2)
        count += 1
    model.train(was_training)
    return {k: s / max(count, 1) for k, s in sums.items()}


class Curv(Objective):
    spec = declared.CURV

    def __init__(self, settings: CurvSettings, job=None):
        super().__init__(settings, job)
        self.weight = settings.lam

    @property
    def summed(self) -> bool:
        """Whether the server takes the payload as a sum: it holds totals, not each node's
        terms."""
        content = self.job.message.content if self.job is not None else {}
        return CONFIG in content and SUMMED_PAYLOAD in content[CONFIG]

    def prepare(self, model, x, y) -> None:
        self.params = {k: p for k, p in model.named_parameters() if p.requires_grad}
        self.penalty = self.anchor = None
        content = self.job.message.content if self.job is not None else {}
        self.kept = self.own_terms(content, x.device) if self.summed else None
        if FISHER_PENALTY in content:  # none in a node's first round
            record = content[FISHER_PENALTY]
            self.penalty = {k: torch.from_numpy(np.array(record[f"penalty.{k}"].numpy()))
                            .to(x.device) for k in self.params}
            self.anchor = {k: torch.from_numpy(np.array(record[f"anchor.{k}"].numpy()))
                           .to(x.device) for k in self.params}
            if self.kept is not None:  # the totals less this node's own terms
                for k in self.params:
                    penalty = self.penalty[k] - self.kept[f"F.{k}"]
                    self.anchor[k] = torch.where(penalty > 0,
                                                 self.anchor[k] - self.kept[f"G.{k}"], 0.0)
                    self.penalty[k] = penalty.clamp(min=0.0)
        self.x, self.y = x, y

    def own_terms(self, content, device) -> dict[str, torch.Tensor]:
        """The terms the server's totals hold of this node: the pending ones if the message
        says the totals took them (then they are kept), else those kept before (zero at first)."""
        context = self.job.context
        pending = recall(context, PENDING_STATE, device)
        included = (int(content[FISHER_PENALTY][INCLUDED_ROUND].numpy()[0])
                    if FISHER_PENALTY in content else -1)
        if pending is not None and int(pending.pop("round")[0]) == included:
            keep(context, SUMMED_STATE, pending)
        kept = recall(context, SUMMED_STATE, device)
        return kept if kept is not None else {
            f"{part}.{k}": torch.zeros_like(p) for part in "FG" for k, p in self.params.items()}

    def term(self, batch: Batch) -> torch.Tensor | None:
        if self.penalty is None:
            return None
        return curvature_penalty(self.params, self.penalty, self.anchor)

    def after_training(self, model, stats) -> None:
        batch_size = self.job.experiment.batch_size if self.job is not None else 64
        self.fisher = diagonal_fisher(model, self.x, self.y, batch_size)
        if self.kept is not None:  # the change of this node's terms, clipped as summed
            terms = {**{f"F.{k}": f for k, f in self.fisher.items()},
                     **{f"G.{k}": f * self.params[k].detach() for k, f in self.fisher.items()}}
            names = sorted(terms)
            change = [(terms[n] - self.kept[n]).double().cpu().numpy() for n in names]
            clip = payload_clip(self.job.experiment)
            if clip is not None:
                clip_update(change, clip, in_place=True)
            self.change = {n: torch.from_numpy(c.astype(np.float32)) for n, c in
                           zip(names, change)}
            keep(self.job.context, PENDING_STATE, {
                **{n: self.kept[n].cpu() + c for n, c in self.change.items()},
                "round": torch.tensor([self.job.server_round])})

    def diagnostics(self) -> dict[str, float]:
        return {"fisher-mean": float(torch.cat([f.flatten() for f in self.fisher.values()])
                                     .mean())}

    def reply_records(self) -> dict:
        if self.kept is not None:
            return {FISHER_DELTA: ArrayRecord({n: Array(c.numpy())
                                               for n, c in self.change.items()})}
        return {FISHER: ArrayRecord({k: Array(v.cpu().numpy()) for k, v in self.fisher.items()})}
