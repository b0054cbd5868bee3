"""The local-training loop and the objectives, on hand-checked cases."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from driftfl.client.objectives import OBJECTIVES, Batch, Objective, build_objective
from driftfl.client.train import TrainSettings, batches, train_locally
from driftfl.common.models import build_model
from driftfl.common.training import LocalSGD

SETTINGS = TrainSettings(epochs=2, batch_size=4, lr=0.1, momentum=0.9, weight_decay=1e-4)


def data(n=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 6, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def model(seed=0):
    torch.manual_seed(seed)
    return build_model({"name": "mlp", "hidden": [8]}, (1, 6, 6), 3)


def test_the_client_knows_every_objective_a_method_names():
    from driftfl.methods import METHODS

    assert {method.objective for method in METHODS.values()} <= set(OBJECTIVES)
    assert set(OBJECTIVES) == {"ce", "prox", "csd", "lsd", "ntd", "gkd", "ssd", "cad", "scaffold",
                               "dyn", "moon", "proto", "curv"}


def test_batches_cover_every_sample_once_per_epoch():
    seen = torch.cat(list(batches(10, 4, torch.Generator().manual_seed(0))))
    assert sorted(seen.tolist()) == list(range(10))
    assert [len(idx) for idx in batches(10, 4, torch.Generator())] == [4, 4, 2]


def test_cross_entropy_objective_is_plain_cross_entropy():
    logits, y = torch.randn(5, 3), torch.tensor([0, 1, 2, 1, 0])
    batch = Batch(None, y, None, logits, torch.arange(5))
    assert torch.allclose(Objective({}).loss(batch), F.cross_entropy(logits, y))


def test_prox_term_is_half_squared_distance_to_the_global_weights():
    net = model()
    prox = build_objective("prox", {"mu": 0.5})
    x, y = data()
    prox.prepare(net, x, y)
    with torch.no_grad():
        net.head.bias += torch.tensor([1.0, 2.0, 2.0])  # ||delta||^2 = 9
    logits = net(x)
    batch = Batch(x, y, None, logits, torch.arange(len(y)))
    assert torch.isclose(prox.term(batch), torch.tensor(4.5))
    assert torch.isclose(prox.loss(batch), F.cross_entropy(logits, y) + 0.5 * 4.5)


def test_prox_gradient_pulls_towards_the_global_weights():
    net = model()
    prox = build_objective("prox", {"mu": 1.0})
    prox.prepare(net, *data())
    with torch.no_grad():
        net.head.bias += 1.0
    prox.term(None).backward()
    assert torch.allclose(net.head.bias.grad, torch.ones(3))  # d/dw 1/2 ||w - w_G||^2 = w - w_G


def train(objective, seed=0):
    net = model()
    x, y = data()
    stats = train_locally(net, x, y, SETTINGS, objective, torch.Generator().manual_seed(seed))
    return net, stats


def test_training_is_reproducible_and_counts_steps():
    a, stats = train(Objective({}))
    b, _ = train(Objective({}))
    assert stats.steps == 6 and stats.num_examples == 10  # 2 epochs x ceil(10 / 4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_prox_with_mu_zero_trains_exactly_like_fedavg():
    a, _ = train(Objective({}))
    b, _ = train(build_objective("prox", {"mu": 0.0}))
    assert all(torch.allclose(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_prox_keeps_the_model_closer_to_where_it_started():
    start = [p.detach().clone() for p in model().parameters()]
    free, _ = train(Objective({}))
    held, _ = train(build_objective("prox", {"mu": 10.0}))

    def drift(net):
        return sum(float((p.detach() - s).pow(2).sum()) for p, s in zip(net.parameters(), start))

    assert drift(held) < drift(free)


def test_logit_shift_is_kl_of_the_trained_to_the_global_logits_on_a_fixed_probe():
    from driftfl.client.train import LogitShift

    x, y = data(20)
    net = model()
    shift = LogitShift(net, x, 6, torch.Generator().manual_seed(3))
    probe = torch.randperm(20, generator=torch.Generator().manual_seed(3))[:6]
    assert torch.equal(shift.x, x[probe])  # the probe: `samples` local samples, seeded
    with torch.no_grad():
        before = net.eval()(x[probe])
    assert shift.measure(net) == 0.0  # the global model has not moved
    train_locally(net, x, y, SETTINGS, build_objective("ce", {}), torch.Generator())
    with torch.no_grad():
        after = net.eval()(x[probe])
    expected = (F.softmax(after, 1) * (F.log_softmax(after, 1) - F.log_softmax(before, 1)))
    assert abs(shift.measure(net) - float(expected.sum(1).mean())) < 1e-6
    assert LogitShift(net, x, 0, torch.Generator()).measure(net) == 0.0  # samples=0: off


@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 5e-4)])
def test_local_sgd_steps_as_torch_optim_sgd_to_the_byte(momentum, weight_decay):
    """LocalSGD (torch's update function without the class, which imports torch._dynamo) against
    torch.optim.SGD: the same parameters after steps where a layer's gradient is sometimes
    absent (frozen for a step: SGD skips it and keeps its momentum)."""
    ours, theirs = model(seed=3), model(seed=3)
    x, y = data(n=32, seed=1)
    local = LocalSGD(ours.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay)
    reference = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=momentum,
                                weight_decay=weight_decay)
    for step in range(6):
        for net, optimizer in ((ours, local), (theirs, reference)):
            optimizer.zero_grad()
            F.cross_entropy(net(x[step * 4:step * 4 + 8]), y[step * 4:step * 4 + 8]).backward()
            if step == 2:  # the first layer sits this step out
                next(net.parameters()).grad = None
            optimizer.step()
    for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(ours.state_dict().values(),
                                                     model(seed=3).state_dict().values()))
