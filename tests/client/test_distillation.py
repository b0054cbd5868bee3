"""The teacher-distillation family pinned on hand-worked cases: FedCSD, FedLSD, FedNTD, FedGKD."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord, Context, RecordDict

from driftfl.client.objectives.csd import (class_prototypes, csd_loss, csd_mask,
                                           recall_teacher_logits, remember_teacher_logits)
from driftfl.client.objectives.distill import logits_of
from driftfl.client.objectives.gkd import gkd_term
from driftfl.client.objectives.lsd import lsd_loss
from driftfl.client.objectives.ntd import drop_true_class, not_true_kl


def softmax(v):
    e = [math.exp(a) for a in v]
    return [a / sum(e) for a in e]


# --- FedCSD -----------------------------------------------------------------------------------

def test_csd_loss_on_a_hand_worked_case():
    """3 classes, 2 samples, tau = 2, prototypes = identity rows; sample 2 is masked out."""
    tau = 2.0
    z = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]  # local logits
    z_t = [[2.0, 1.0, 0.0], [0.0, 0.0, 3.0]]  # teacher logits
    labels = [0, 1]
    # sample 1: cos(z1, e_c) = (1, 0, 0); weights = softmax(1, 0, 0); z_hat = weights * z_t
    w = softmax([1.0, 0.0, 0.0])
    z_hat = [w[c] * z_t[0][c] for c in range(3)]
    q_t = softmax([a / tau for a in z_hat])
    log_q = [math.log(p) for p in softmax([a / tau for a in z[0]])]
    sample1 = tau ** 2 * -sum(q_t[c] * log_q[c] for c in range(3))
    # the teacher gives sample 1's label 0 a probability above 1/3: kept
    assert softmax(z_t[0])[0] > 1 / 3
    # sample 2: the teacher gives label 1 probability 1/(2 + e^3) < 1/3: masked out
    assert softmax(z_t[1])[1] < 1 / 3
    expected = (sample1 + 0.0) / 2  # batch mean over both samples, the masked one included

    loss = csd_loss(torch.tensor(z), torch.tensor(z_t), torch.tensor(labels), torch.eye(3), tau)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_csd_gradient_does_not_flow_through_the_similarity_weights():
    torch.manual_seed(0)
    z = torch.randn(4, 5, requires_grad=True)
    z_t, y, prototypes, tau = torch.randn(4, 5), torch.tensor([0, 1, 2, 3]), torch.randn(5, 5), 3.0
    csd_loss(z, z_t, y, prototypes, tau).backward()
    # with the weights held constant, d/dz [tau^2 CE(q_t, softmax(z / tau))] = tau (q - q_t)
    weights = F.softmax(F.cosine_similarity(z.detach()[:, None], prototypes[None], dim=2), dim=1)
    q_t = F.softmax(weights * z_t / tau, dim=1)
    q = F.softmax(z.detach() / tau, dim=1)
    mask = csd_mask(z_t, y, "adaptive")[:, None]
    assert torch.allclose(z.grad, mask * tau * (q - q_t) / 4, atol=1e-6)
    assert not z_t.requires_grad


def test_forcible_mask_differs_from_adaptive_where_it_should():
    # teacher probabilities (0.39, 0.47, 0.14): label 0 is above 1/3 but not the argmax
    z_t = torch.tensor([[1.0, 1.2, 0.0], [3.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    y = torch.tensor([0, 0, 0])
    assert csd_mask(z_t, y, "adaptive").tolist() == [1.0, 1.0, 0.0]
    assert csd_mask(z_t, y, "forcible").tolist() == [0.0, 1.0, 0.0]
    assert csd_mask(z_t, y, "off").tolist() == [1.0, 1.0, 1.0]


def test_without_similarity_the_teacher_logits_are_used_as_they_are():
    z, z_t, y = torch.randn(3, 4), torch.randn(3, 4), torch.tensor([0, 1, 2])
    plain = csd_loss(z, z_t, y, torch.randn(4, 4), 5.0, similarity=False, mask="off")
    q_t = F.softmax(z_t / 5.0, dim=1)
    expected = (-(q_t * F.log_softmax(z / 5.0, dim=1)).sum(1) * 25.0).mean()
    assert torch.isclose(plain, expected)


def test_client_prototypes_are_per_class_mean_teacher_logits():
    logits = torch.tensor([[1.0, 2.0], [3.0, 4.0], [10.0, 0.0]])
    prototypes, counts = class_prototypes(logits, torch.tensor([0, 0, 1]), 3)
    assert prototypes.tolist() == [[2.0, 3.0], [10.0, 0.0], [0.0, 0.0]]
    assert counts.tolist() == [2, 1, 0]


def test_teacher_logits_of_the_prototype_phase_are_reused_only_for_the_same_teacher():
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    teacher = ArrayRecord({"w": Array(torch.ones(3).numpy())})
    other = ArrayRecord({"w": Array(torch.zeros(3).numpy())})
    logits = torch.randn(5, 3)
    remember_teacher_logits(context, teacher, logits)
    assert torch.equal(recall_teacher_logits(context, teacher, 5), logits)
    assert recall_teacher_logits(context, other, 5) is None  # another teacher: recompute
    assert recall_teacher_logits(context, teacher, 6) is None  # other data: recompute


def test_logits_of_restores_training_mode():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2)).train()
    logits_of(model, torch.randn(4, 2))
    assert model.training


def test_logits_of_batches_in_order_like_one_forward_pass():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3)).eval()
    x = torch.randn(300, 2)  # more than one CPU batch, the last one partial
    with torch.no_grad():
        expected = model(x)
    assert torch.allclose(logits_of(model, x), expected, atol=1e-6)
    assert torch.allclose(logits_of(model, x, batch_size=7), expected, atol=1e-6)


# --- FedLSD, FedNTD, FedGKD ---------------------------------------------------------------------

def test_lsd_is_a_beta_mix_of_cross_entropy_and_soft_cross_entropy_without_t_squared():
    z, z_g, y = [[1.0, 2.0, 0.0]], [[0.0, 1.0, 3.0]], [1]
    beta, T = 0.3, 2.0
    ce = -math.log(softmax(z[0])[1])
    target = softmax([a / T for a in z_g[0]])
    soft = -sum(t * math.log(p) for t, p in zip(target, softmax([a / T for a in z[0]])))
    got = lsd_loss(torch.tensor(z), torch.tensor(z_g), torch.tensor(y), beta, T)
    assert got.item() == pytest.approx((1 - beta) * ce + beta * soft, rel=1e-6)


def test_ntd_removes_the_true_class_before_the_softmax():
    logits = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert drop_true_class(logits, torch.tensor([1, 0])).tolist() == [[1.0, 3.0], [5.0, 6.0]]
    z, z_g, y = torch.tensor([[0.5, 9.0, -1.0]]), torch.tensor([[2.0, -3.0, 0.0]]), torch.tensor([1])
    # by hand: not-true logits z = (0.5, -1), z_g = (2, 0); KL(p_g || p), tau = 1
    p, p_g = softmax([0.5, -1.0]), softmax([2.0, 0.0])
    expected = sum(a * math.log(a / b) for a, b in zip(p_g, p))
    assert not_true_kl(z, z_g, y, 1.0).item() == pytest.approx(expected, rel=1e-5)  # float32
    # the student's true-class logit does not matter
    z2 = z.clone()
    z2[0, 1] = -50.0
    assert torch.isclose(not_true_kl(z2, z_g, y, 1.0), not_true_kl(z, z_g, y, 1.0))


def test_gkd_term_is_tau_squared_kl_to_the_teacher():
    z, z_t, tau = [[1.0, 0.0]], [[0.0, 2.0]], 2.0
    p_t, p = softmax([0.0, 1.0]), softmax([0.5, 0.0])
    expected = tau ** 2 * sum(a * math.log(a / b) for a, b in zip(p_t, p))
    assert gkd_term(torch.tensor(z), torch.tensor(z_t), tau).item() == pytest.approx(expected)


def test_csd_one_exchange_reply_carries_this_rounds_client_prototypes():
    from types import SimpleNamespace

    from flwr.app import ConfigRecord

    from driftfl.client.objectives import build_objective
    from driftfl.common.protocol import CONFIG, PROTOTYPES_IN_REPLY
    from driftfl.common.protocol import PROTOTYPES as RECORD

    torch.manual_seed(0)
    teacher = torch.nn.Linear(4, 3)
    x, y = torch.randn(6, 4), torch.tensor([0, 0, 1, 1, 1, 2])

    def job(asks_for_prototypes):  # the train message of a one-exchange round asks for P_k
        message = SimpleNamespace(content={
            "teacher": ArrayRecord({k: Array(v.detach().numpy())
                                    for k, v in teacher.state_dict().items()}),
            RECORD: ArrayRecord({"prototypes": Array(np.zeros((3, 3), np.float32))}),
            CONFIG: ConfigRecord({PROTOTYPES_IN_REPLY: True} if asks_for_prototypes else {})})
        return SimpleNamespace(message=message, model=lambda record: teacher,
                               context=Context(run_id=1, node_id=1, node_config={},
                                               state=RecordDict(), run_config={}))

    params = {"mu": 0.001, "tau": 10.0, "similarity": True, "mask": "adaptive"}
    objective = build_objective("csd", params, job(True))
    objective.prepare(torch.nn.Linear(4, 3), x, y)
    sent = objective.reply_records()[RECORD]
    expected, counts = class_prototypes(teacher(x).detach(), y, 3)
    assert np.allclose(sent["prototypes"].numpy(), expected.numpy(), atol=1e-6)
    assert sent["counts"].numpy().tolist() == counts.tolist() == [2, 3, 1]
    assert build_objective("csd", params, job(False)).reply_records() == {}


# --- FedCSD as its authors' code runs it (+experiment=fedcsd_code) ----------------------------

def test_csd_kl_is_the_soft_cross_entropy_less_the_targets_entropy():
    torch.manual_seed(0)
    z, z_t = torch.randn(6, 4), torch.randn(6, 4)
    labels, prototypes, tau = torch.tensor([0, 1, 2, 3, 0, 1]), torch.randn(4, 4), 4.0
    soft_ce = csd_loss(z, z_t, labels, prototypes, tau, mask="off")
    kl = csd_loss(z, z_t, labels, prototypes, tau, mask="off", divergence="kl")
    weights = F.softmax(F.cosine_similarity(z[:, None], prototypes[None], dim=2), dim=1)
    target = F.softmax(weights * z_t / tau, dim=1)
    entropy = -(target * target.log()).sum(dim=1).mean()
    assert kl.item() == pytest.approx(soft_ce.item() - tau ** 2 * entropy.item(), rel=1e-5)


def test_csd_mask_on_the_refined_teacher_drops_what_the_plain_teacher_keeps():
    """2 classes: z = (1, 0), P = ((1, 0), (-1, 0)): cos = (1, -1), weights softmax(1, -1) =
    (0.881, 0.119). Teacher (-1, -3), label 0: p_t(0) = sigmoid(2) = 0.88 > 1/2, kept; refined
    (-0.881, -0.357): p(0) = sigmoid(-0.524) = 0.37 < 1/2, dropped."""
    z, z_t = torch.tensor([[1.0, 0.0]]), torch.tensor([[-1.0, -3.0]])
    labels, prototypes = torch.tensor([0]), torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    assert csd_loss(z, z_t, labels, prototypes, 1.0, mask_on="teacher").item() > 0
    assert csd_loss(z, z_t, labels, prototypes, 1.0, mask_on="refined").item() == 0


def test_csd_code_reading_lets_the_gradient_through_the_similarity():
    torch.manual_seed(1)
    z_t, labels, prototypes = torch.randn(4, 3), torch.tensor([0, 1, 2, 0]), torch.randn(3, 3)
    grads = []
    for detach in (True, False):
        z = torch.randn(4, 3, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
        csd_loss(z, z_t, labels, prototypes, 4.0, mask="off", divergence="kl",
                 detach_similarity=detach).backward()
        grads.append(z.grad)
    assert not torch.allclose(grads[0], grads[1])


def csd_job(teacher, content=None):
    from types import SimpleNamespace

    from flwr.app import ConfigRecord

    from driftfl.common.protocol import CONFIG
    message = SimpleNamespace(content={
        "teacher": ArrayRecord({k: Array(v.detach().numpy())
                                for k, v in teacher.state_dict().items()}),
        CONFIG: ConfigRecord({}), **(content or {})})
    return SimpleNamespace(message=message, model=lambda record: teacher, num_classes=3,
                           context=Context(run_id=1, node_id=1, node_config={},
                                           state=RecordDict(), run_config={}))


CODE = {"mu": 0.5, "tau": 4.0, "prototypes": "local", "combination": "convex",
        "mask_on": "refined", "divergence": "kl", "detach_similarity": False}


def test_csd_local_prototypes_come_from_the_teachers_logits_on_the_clients_data():
    from driftfl.client.objectives import build_objective
    from driftfl.common.models import DriftModel

    torch.manual_seed(0)
    teacher = torch.nn.Linear(4, 3)
    x, y = torch.randn(6, 4), torch.tensor([0, 0, 1, 1, 1, 2])
    objective = build_objective("csd", CODE, csd_job(teacher))  # no prototypes record sent
    objective.prepare(DriftModel(torch.nn.Identity(), 4, 3), x, y)
    expected, _ = class_prototypes(teacher(x).detach(), y, 3)
    assert torch.allclose(objective.prototypes, expected, atol=1e-6)


def test_csd_convex_combination_weighs_ce_by_one_minus_mu():
    from driftfl.client.objectives import build_objective
    from driftfl.common.models import DriftModel
    from driftfl.common.training import Batch

    torch.manual_seed(0)
    teacher, student = torch.nn.Linear(4, 3), DriftModel(torch.nn.Identity(), 4, 3)
    x, y = torch.randn(6, 4), torch.tensor([0, 0, 1, 1, 1, 2])
    objective = build_objective("csd", CODE, csd_job(teacher))
    objective.prepare(student, x, y)
    batch = Batch(x, y, x, student(x), torch.arange(6))
    expected = 0.5 * F.cross_entropy(batch.logits, y) + 0.5 * objective.term(batch)
    assert objective.loss(batch).item() == pytest.approx(expected.item())
