"""FedSSD and FedCAD pinned on hand-worked cases, and the server's held-back auxiliary set."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from driftfl.client.objectives.base import Objective
from driftfl.client.objectives.cad import cad_loss, class_alpha, class_phi
from driftfl.client.objectives.lsd import lsd_loss
from driftfl.client.objectives.ssd import PSI, ssd_loss, ssd_weights
from driftfl.client.train import TrainSettings, train_locally
from driftfl.common.models import build_model
from driftfl.common.partition import aux_indices, partition
from driftfl.strategies.parts.aggregation import mean_metrics
from driftfl.strategies.parts.aux_set import AuxSet

A = torch.tensor([[0.8, 0.2, 0.0],   # class 0: recall 0.8, mistaken for class 1 20 % of the time
                  [0.1, 0.6, 0.3],
                  [0.0, 0.5, 0.5]])


def test_ssd_weights_on_a_hand_built_confusion_matrix():
    p_g = torch.tensor([[0.64, 0.16, 0.20], [0.25, 0.75, 0.0]])  # global model's probabilities
    y = torch.tensor([0, 1])
    lam = 0.01
    w = ssd_weights(A, p_g, y, lam, "sqrt")
    psi0, psi1 = 1 - math.sqrt(1 - 0.64), 1 - math.sqrt(1 - 0.75)  # 0.4, 0.5
    # sample 0 (y = 0): w_0 = lam A_00 psi; w_c = lam A_cc (1 - A_0c) psi for c != 0
    expected0 = [lam * 0.8 * psi0, lam * 0.6 * (1 - 0.2) * psi0, lam * 0.5 * (1 - 0.0) * psi0]
    # sample 1 (y = 1)
    expected1 = [lam * 0.8 * (1 - 0.1) * psi1, lam * 0.6 * psi1, lam * 0.5 * (1 - 0.3) * psi1]
    assert torch.allclose(w, torch.tensor([expected0, expected1]), atol=1e-8)

    z, z_g = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 0.0]]), torch.tensor([[2.0, 1.0, 0.0],
                                                                          [1.0, 3.0, -1.0]])
    p = torch.softmax(z_g, 1)  # the loss takes p_g from the global logits themselves
    w = ssd_weights(A, p, y, lam)
    expected = ((w * (z_g - z) ** 2).sum(1)).mean()
    assert torch.isclose(ssd_loss(z, z_g, y, A, lam), expected)


def test_lam_bounds_every_weight_and_psi_is_increasing_from_0_to_1():
    torch.manual_seed(0)
    matrix = torch.softmax(torch.randn(6, 6), dim=1)
    probs = torch.softmax(3 * torch.randn(50, 6), dim=1)
    y = torch.randint(0, 6, (50,))
    for psi in PSI:
        w = ssd_weights(matrix, probs, y, 0.01, psi)
        assert (w >= 0).all() and (w <= 0.01 + 1e-9).all()
    grid = torch.linspace(0, 1, 101)
    for name, fn in PSI.items():
        values = fn(grid)
        assert values[0] == 0 and values[-1] == 1 and (values.diff() >= 0).all(), name


def test_constant_weights_make_ssd_plain_mse():
    ones = torch.ones(3, 3)  # recall 1 and no mistakes: every (1 - A_yc) = 0 off the diagonal
    p_g = torch.tensor([[1.0, 0.0, 0.0]])
    w = ssd_weights(ones * torch.eye(3), p_g, torch.tensor([0]), 0.5, "identity")
    assert torch.allclose(w, torch.tensor([[0.5, 0.5, 0.5]]))


def test_fedcad_alpha_stays_within_its_bounds():
    torch.manual_seed(1)
    logits, y = 4 * torch.randn(40, 5), torch.randint(0, 5, (40,))
    phi = class_phi(logits, y, 5)
    assert ((phi >= -1) & (phi <= 1)).all()
    alpha = class_alpha(phi, 0.25, 0.5)
    assert ((alpha >= 0.25) & (alpha <= 0.5)).all()
    # phi = 1 (certain and right) gives gamma_max, phi = -1 gives gamma_min
    assert class_alpha(torch.tensor([1.0, -1.0]), 0.25, 0.5).tolist() == [0.5, 0.25]
    # by hand: two class-0 samples with p_g,0 = 0.9 and 0.5 -> phi = mean(0.8, 0.0) = 0.4
    two = torch.log(torch.tensor([[0.9, 0.1], [0.5, 0.5]]))
    assert torch.allclose(class_phi(two, torch.tensor([0, 0]), 2)[0], torch.tensor(0.4))


class CAD(Objective):
    """FedCAD's loss with the teacher logits given directly (no message needed)."""

    def __init__(self, gamma, teacher_of, classes=3):
        super().__init__({})
        self.gamma, self.teacher_of, self.classes = gamma, teacher_of, classes

    def loss(self, batch):
        alpha = class_alpha(torch.zeros(self.classes), self.gamma, self.gamma)
        return cad_loss(batch.logits, self.teacher_of[batch.index], batch.y, alpha, 2.0)


def local_epoch(objective, seed=0):
    torch.manual_seed(seed)
    model = build_model({"name": "mlp", "hidden": [8]}, (1, 4, 4), 3)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(20, 1, 4, 4, generator=g), torch.randint(0, 3, (20,), generator=g)
    settings = TrainSettings(1, 8, 0.1, 0.9, 0.0)
    train_locally(model, x, y, settings, objective, torch.Generator().manual_seed(seed))
    return model


def test_fedcad_with_both_gammas_zero_trains_exactly_like_fedavg():
    teacher = torch.randn(20, 3)
    fedavg, cad = local_epoch(Objective({})), local_epoch(CAD(0.0, teacher))
    assert all(torch.equal(p, q) for p, q in zip(fedavg.parameters(), cad.parameters()))


def test_fedcad_with_both_gammas_c_equals_fedlsd_with_beta_c():
    z, z_g, y = torch.randn(6, 3), torch.randn(6, 3), torch.tensor([0, 1, 2, 0, 1, 2])
    alpha = class_alpha(class_phi(z_g, y, 3), 0.3, 0.3)
    assert torch.allclose(cad_loss(z, z_g, y, alpha, 2.0), lsd_loss(z, z_g, y, 0.3, 2.0))


def test_aux_set_is_disjoint_from_every_client():
    labels = np.repeat(np.arange(10), 300)
    held = aux_indices(labels, 64, seed=0)
    assert np.bincount(labels[held]).tolist() == [64] * 10
    spec = {"name": "dirichlet", "alpha": 0.1, "min_size": 10, "self_balancing": False}
    parts = partition(labels, spec, 10, seed=0, aux=held)
    given = np.concatenate(parts)
    assert not set(given) & set(held)  # no client ever holds a sample of the aux set
    assert len(given) + len(held) == len(labels)  # and nothing else is lost
    assert not np.array_equal(held, aux_indices(labels, 64, seed=1))


def test_aux_set_confusion_and_phi_by_hand():
    model = torch.nn.Linear(2, 2, bias=False)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    y = torch.tensor([0, 0, 1])
    aux = AuxSet(x, y, model, 2)
    arrays = {"weight": np.eye(2, dtype=np.float32) * math.log(3)}  # logits = log 3 * x
    # class 0: samples predicted 0 and 1 -> row (0.5, 0.5); class 1: predicted 0 -> (1, 0)
    assert np.allclose(aux.confusion(arrays), [[0.5, 0.5], [1.0, 0.0]])
    # p_0 of sample 1 = 3 / 4, of sample 2 = 1 / 4; p_1 of sample 3 = 1 / 10
    assert np.allclose(aux.class_phi(arrays), [(0.5 + -0.5) / 2, 2 * 0.1 - 1], atol=1e-6)


def test_per_class_metrics_are_averaged_without_the_classes_a_client_lacks():
    class Update:
        def __init__(self, n, values):
            self.metrics = {"num-examples": n, "class-alpha": values}
            self.num_examples = n

    updates = [Update(10, [0.3, float("nan")]), Update(30, [0.5, 0.4])]
    out = mean_metrics(updates, np.array([0.25, 0.75]))
    assert out["class-alpha"] == pytest.approx([0.45, 0.4])


def test_fedssd_sends_the_global_models_credibility_on_the_aux_set(server_task):
    from flwr.app import Array, ArrayRecord, ConfigRecord

    from driftfl.common.config import compose
    from driftfl.common.protocol import CREDIBILITY
    from driftfl.methods import build_strategy, check_experiment

    model = torch.nn.Linear(2, 2, bias=False)
    aux = AuxSet(torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]]),
                       torch.tensor([0, 0, 1]), model, 2)
    cfg = check_experiment(compose(["strategy=fedssd", "num_clients=1"]))
    strategy = build_strategy(cfg, None, aux)

    class Grid:
        def get_node_ids(self):
            return [7]

    arrays = {"weight": np.eye(2, dtype=np.float32) * math.log(3)}
    messages = list(strategy.configure_train(
        1, ArrayRecord({k: Array(v) for k, v in arrays.items()}), ConfigRecord(), Grid()))
    sent = messages[0].content[CREDIBILITY]["matrix"].numpy()
    assert np.allclose(sent, [[0.5, 0.5], [1.0, 0.0]])
    assert strategy.server_metrics(None) == {"credibility_diag_mean": 0.25}
    assert np.array_equal(strategy.round_arrays()["credibility"], sent)
