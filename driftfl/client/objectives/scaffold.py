"""SCAFFOLD (Karimireddy et al. 2020), the client: control variates correct the local drift.

Every local step follows g <- grad L + c - c_k, c the server's control variate (the train
message's ``control`` record) and c_k this node's (kept in its state; zeros on its first round);
the optimizer's momentum and weight decay then apply as usual. After tau_k local steps
  c_k+ = c_k - c + (w_G - w_k) / (a_k lr),
a_k the effective step count: with divisor=effective FedNova's normaliser for SGD momentum rho
(= tau_k when rho = 0; the FedNTD code's "adaptive division"), with divisor=steps tau_k always
(the paper's formula). The node keeps c_k+ and replies Delta c_k = c_k+ - c_k
(``control-delta``), which the server adds into c. Delta c_k = -c + (w_G - w_k) / (a_k lr)
does not depend on c_k; it is computed in that form, so the server can recompute it from the
reply's own model and step count.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from torch import nn

from driftfl.client.state import keep, recall
from driftfl.common.protocol import CONTROL, CONTROL_DELTA
from driftfl.common.sgd import nova_normaliser
from driftfl.specs import objectives as declared

from .base import Objective

STATE = "scaffold.control"  # c_k in the node's context.state

Tensors = dict[str, torch.Tensor]


def step_scale(steps: float, lr: float, momentum: float, divisor: str = "effective") -> float:
    """a_k * lr, what the model's move is divided by to give the mean corrected gradient."""
    a = nova_normaliser(steps, momentum) if divisor == "effective" else float(steps)
    return a * lr


def control_delta(control: Tensors, w_global: Tensors, w_local: Tensors,
                  scale: float) -> Tensors:
    """Delta c_k = c_k+ - c_k = -c + (w_G - w_k) / scale, per parameter name."""
    return {k: (w_global[k] - w_local[k]) / scale - c for k, c in control.items()}


def correct_gradients(params: dict[str, nn.Parameter], correction: Tensors) -> None:
    """grad <- grad + (c - c_k) in place (a parameter the loss did not reach gets c - c_k)."""
    for name, p in params.items():
        if p.grad is None:
            p.grad = correction[name].clone()
        else:
            p.grad.add_(correction[name])


def norm(tensors: Tensors) -> float:
    return float(torch.sqrt(sum((t.double() ** 2).sum() for t in tensors.values())))


class Scaffold(Objective):
    """Cross-entropy with the corrected gradient. Without a job (unit tests) c = c_k = 0 and
    nothing is kept."""

    spec = declared.SCAFFOLD

    def prepare(self, model, x, y) -> None:
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.anchor = {n: p.detach().clone() for n, p in self.params.items()}  # w_G
        zeros = {n: torch.zeros_like(a) for n, a in self.anchor.items()}
        self.control, self.local = zeros, zeros  # c, c_k
        if self.job is not None:
            record = self.job.message.content[CONTROL]
            self.control = {n: torch.from_numpy(np.array(record[n].numpy())).to(a.device)
                            for n, a in self.anchor.items()}
            kept = recall(self.job.context, STATE, x.device)
            if kept is not None and set(kept) == set(self.anchor):
                self.local = kept
        self.correction = {n: self.control[n] - self.local[n] for n in self.anchor}
        self.delta: Tensors | None = None

    def before_step(self, model) -> None:
        correct_gradients(self.params, self.correction)

    @torch.no_grad()
    def after_training(self, model, stats) -> None:
        if self.job is None or stats.steps < 1:  # no step taken: c_k stays, nothing to send
            return
        exp = self.job.experiment
        scale = step_scale(stats.steps, exp.lr, exp.momentum, self.settings.divisor)
        self.delta = control_delta(self.control, self.anchor,
                                   {n: p.detach() for n, p in self.params.items()}, scale)
        keep(self.job.context, STATE, {n: self.local[n] + d for n, d in self.delta.items()})

    def diagnostics(self) -> dict[str, float]:
        return {"control-norm": norm(self.local)}  # ||c_k|| this round trained with

    def reply_records(self) -> dict:
        if self.delta is None:
            return {}
        return {CONTROL_DELTA: ArrayRecord({n: Array(d.cpu().numpy())
                                            for n, d in self.delta.items()})}
