"""FedDyn (Acar et al. 2021), the client: a dynamic regulariser that aligns local and global
stationary points.

  L = CE - <g_k, w> + (alpha / 2) ||w - w_G||^2,
sums over the trainable parameters, w_G the weights the round started from and g_k this node's
previous-gradient state (zeros on its first round, kept in its context.state). After local
training
  g_k <- g_k - alpha (w_k - w_G),
the first-order condition of the local problem: grad CE(w_k) = g_k - alpha (w_k - w_G).
Nothing beyond the model crosses the wire; the server's half is strategies/feddyn.py.
"""

from __future__ import annotations

import torch

from driftfl.client.state import keep, recall
from driftfl.specs import objectives as declared

from .base import Batch, Objective

STATE = "feddyn.grad-prev"  # g_k in the node's context.state

Tensors = dict[str, torch.Tensor]


def dyn_term(params: Tensors, anchor: Tensors, grad_prev: Tensors, alpha: float) -> torch.Tensor:
    """-<g_k, w> + (alpha / 2) ||w - w_G||^2 over the parameters (its gradient:
    -g_k + alpha (w - w_G))."""
    linear = sum((grad_prev[n] * p).sum() for n, p in params.items())
    square = sum((p - anchor[n]).pow(2).sum() for n, p in params.items())
    return -linear + 0.5 * alpha * square


def next_grad_prev(grad_prev: Tensors, w_local: Tensors, w_global: Tensors,
                   alpha: float) -> Tensors:
    """g_k - alpha (w_k - w_G)."""
    return {n: g - alpha * (w_local[n] - w_global[n]) for n, g in grad_prev.items()}


class Dyn(Objective):
    """Without a job (unit tests) g_k starts at zero and nothing is kept; a test may set
    ``grad_prev`` after ``prepare``."""

    spec = declared.DYN
    weight = 1.0  # the regulariser enters with weight 1: alpha is inside it

    def prepare(self, model, x, y) -> None:
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.anchor = {n: p.detach().clone() for n, p in self.params.items()}  # w_G
        self.grad_prev = {n: torch.zeros_like(a) for n, a in self.anchor.items()}
        if self.job is not None:
            kept = recall(self.job.context, STATE, x.device)
            if kept is not None and set(kept) == set(self.anchor):
                self.grad_prev = kept

    def term(self, batch: Batch) -> torch.Tensor:
        return dyn_term(self.params, self.anchor, self.grad_prev, self.settings.alpha)

    @torch.no_grad()
    def after_training(self, model, stats) -> None:
        self.grad_prev = next_grad_prev(self.grad_prev,
                                        {n: p.detach() for n, p in self.params.items()},
                                        self.anchor, self.settings.alpha)
        if self.job is not None:
            keep(self.job.context, STATE, self.grad_prev)

    def diagnostics(self) -> dict[str, float]:  # ||g_k|| as kept for the next round
        return {"grad-prev-norm": float(torch.sqrt(sum((g.double() ** 2).sum()
                                                       for g in self.grad_prev.values())))}
