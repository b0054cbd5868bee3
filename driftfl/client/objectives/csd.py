"""FedCSD: class prototype similarity distillation (docs/algorithms.md, FedCSD).

For a sample (x, y) with local logits z and frozen teacher logits z_t:
  delta_c = cos(z, P_G,c)  for every class c;   w = softmax(delta)   (a target: detached)
  z_hat = w * z_t;   q_t = softmax(z_hat / tau),  q = softmax(z / tau)
  M = 1[softmax(z_t)_y > 1/|Y|] (adaptive) or 1[argmax z_t = y] (forcible) or 1 (off)
  L_CSD = batch mean of M * tau^2 * (-sum_c q_t,c log q_c);   L = CE + mu * L_CSD.
The prototype phase runs the teacher over all local data before training; the client keeps those
logits in its state and reuses them in the train phase when the train message carries the same
teacher (checked by digest), so the round needs a single teacher forward pass.
With prototypes=previous (one exchange a round) there is no prototype phase: the train message
carries the previous round's P_G and asks (``prototypes-in-reply``) for this round's P_k, made
from the same teacher logits.

The authors' public code (IAMJackYan/FedCSD, train_ours.py) differs from the paper in ways each
of which is a setting here (``+experiment=fedcsd_code`` sets them all): prototypes=local (P from
the teacher's logits on the client's own data, no exchange), combination=convex
((1 - mu) CE + mu L), mask_on=refined (the mask on softmax(z_hat)), divergence=kl
(KL(q_t || q) instead of the soft cross-entropy) and detach_similarity=false (a gradient path
through delta).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord, ConfigRecord, Context

from driftfl.common.protocol import CONFIG, PROTOTYPES, PROTOTYPES_IN_REPLY, TEACHER
from driftfl.specs import objectives as declared
from driftfl.specs.objectives import CSDSettings

from .distill import Distillation, logits_of

STATE_LOGITS, STATE_TEACHER = "csd.teacher-logits", "csd.teacher"


def csd_mask(teacher_logits: torch.Tensor, labels: torch.Tensor, mode: str) -> torch.Tensor:
    """1.0 for samples whose teacher soft label is kept, 0.0 for those filtered out."""
    if mode == "adaptive":
        p_true = F.softmax(teacher_logits, dim=1).gather(1, labels[:, None]).squeeze(1)
        return (p_true > 1.0 / teacher_logits.shape[1]).float()
    if mode == "forcible":
        return (teacher_logits.argmax(dim=1) == labels).float()
    return torch.ones(len(labels), device=teacher_logits.device)


def refine(logits, teacher_logits, prototypes) -> torch.Tensor:
    """z_hat = softmax_c(cos(z, P_c)) * z_t."""
    delta = F.cosine_similarity(logits[:, None, :], prototypes[None, :, :], dim=2)
    return F.softmax(delta, dim=1) * teacher_logits


def csd_loss(logits, teacher_logits, labels, prototypes, tau: float, similarity: bool = True,
             mask: str = "adaptive", mask_on: str = "teacher", divergence: str = "cross_entropy",
             detach_similarity: bool = True) -> torch.Tensor:
    """L_CSD for a batch (mean over all its samples, masked ones included). The paper's reading
    by default; the other values are the authors' code's (module docstring)."""
    teacher_logits = teacher_logits.detach()
    if similarity:
        refined = refine(logits.detach() if detach_similarity else logits, teacher_logits,
                         prototypes)
    else:
        refined = teacher_logits
    target = F.softmax(refined / tau, dim=1)
    log_q = F.log_softmax(logits / tau, dim=1)
    if divergence == "kl":  # KL(target || q): the soft cross-entropy minus the target's entropy
        per_sample = (target * (F.log_softmax(refined / tau, dim=1) - log_q)).sum(dim=1)
    else:
        per_sample = -(target * log_q).sum(dim=1)
    kept = csd_mask(refined.detach() if mask_on == "refined" else teacher_logits, labels, mask)
    return (kept * per_sample * tau ** 2).mean()


def class_prototypes(logits: torch.Tensor, labels: torch.Tensor, num_classes: int):
    """P_k,c = mean teacher logits over the client's samples of class c (zero row if none)."""
    counts = torch.bincount(labels, minlength=num_classes)
    sums = torch.zeros(num_classes, logits.shape[1], device=logits.device).index_add_(
        0, labels, logits)
    return sums / counts.clamp(min=1)[:, None].to(sums.dtype), counts


def teacher_digest(record: ArrayRecord) -> str:
    digest = hashlib.sha256()
    for key in sorted(record.keys()):
        digest.update(key.encode())
        digest.update(record[key].data)
    return digest.hexdigest()


def remember_teacher_logits(context: Context, teacher: ArrayRecord, logits: torch.Tensor) -> None:
    context.state[STATE_LOGITS] = ArrayRecord({"logits": Array(logits.cpu().numpy())})
    context.state[STATE_TEACHER] = ConfigRecord({"digest": teacher_digest(teacher)})


def recall_teacher_logits(context: Context, teacher: ArrayRecord, n: int) -> torch.Tensor | None:
    state = context.state
    if STATE_TEACHER not in state.config_records or STATE_LOGITS not in state.array_records:
        return None
    if state.config_records[STATE_TEACHER]["digest"] != teacher_digest(teacher):
        return None
    logits = state.array_records[STATE_LOGITS]["logits"].numpy()
    return torch.from_numpy(np.array(logits)) if len(logits) == n else None


class CSD(Distillation):
    spec = declared.CSD
    teacher_record = TEACHER

    def __init__(self, settings: CSDSettings, job=None):
        super().__init__(settings, job)
        self.weight = settings.mu
        self.tau = settings.tau
        self.similarity = settings.similarity
        self.mask = settings.mask

    def compute_teacher_logits(self, model, x):
        teacher = self.job.message.content[TEACHER]
        cached = recall_teacher_logits(self.job.context, teacher, len(x))
        self.reused_logits = cached is not None
        return cached.to(x.device) if cached is not None else super().compute_teacher_logits(
            model, x)

    def prepare(self, model, x, y) -> None:
        super().prepare(model, x, y)
        if self.settings.prototypes == "local":  # the client's own P from the teacher's logits
            num_classes = self.job.num_classes if self.job is not None else int(y.max()) + 1
            self.prototypes = class_prototypes(self.teacher_logits, y, num_classes)[0]
        else:
            self.prototypes = torch.from_numpy(np.array(
                self.job.message.content[PROTOTYPES]["prototypes"].numpy())).to(x.device)
        self.labels = y
        masked_on = self.teacher_logits
        if self.settings.mask_on == "refined":  # as the global model (the start) refines them
            masked_on = refine(logits_of(model, x), self.teacher_logits, self.prototypes) \
                if self.similarity else self.teacher_logits
        kept = csd_mask(masked_on, y, self.mask)
        self.filter_rate = float(1 - kept.mean()) if len(kept) else 0.0

    def term(self, batch):
        s = self.settings
        return csd_loss(batch.logits, self.teacher(batch), batch.y, self.prototypes, self.tau,
                        self.similarity, self.mask, s.mask_on, s.divergence, s.detach_similarity)

    def loss(self, batch):
        if self.settings.combination == "sum":
            return super().loss(batch)
        ce = F.cross_entropy(batch.logits, batch.y)
        return (1 - self.weight) * ce + self.weight * self.term(batch)

    def diagnostics(self) -> dict[str, float]:
        # the share of samples whose teacher soft label the mask dropped; and whether the
        # prototype phase's teacher logits were reused (1) or recomputed (0)
        return {"mask-filter-rate": self.filter_rate,
                "teacher-logits-reused": float(self.reused_logits)}

    def reply_records(self) -> dict:
        if not self.job.message.content[CONFIG].get(PROTOTYPES_IN_REPLY, False):
            return {}
        return {PROTOTYPES: prototype_record(*class_prototypes(
            self.teacher_logits, self.labels, self.prototypes.shape[0]))}


def prototype_record(prototypes: torch.Tensor, counts: torch.Tensor) -> ArrayRecord:
    return ArrayRecord({"prototypes": Array(prototypes.cpu().numpy().astype(np.float32)),
                        "counts": Array(counts.cpu().numpy().astype(np.int64))})


def prototype_reply(job) -> tuple[ArrayRecord, int]:
    """The prototype phase on a client: teacher logits on all local data -> per-class means.
    The logits are kept in the node's state for the train phase."""
    teacher = job.message.content[TEACHER]
    x, y = job.tensors()
    logits = logits_of(job.model(TEACHER), x)
    remember_teacher_logits(job.context, teacher, logits)
    return prototype_record(*class_prototypes(logits, y, job.num_classes)), len(y)
