"""DM's batched iteration (every held class in one pass, DSA per class on views of one batch,
one network re-initialised in place) against the authors' loop, class by class, for the same
draws: the same matching loss and the same gradient on the synthetic pixels, to float
tolerance, without and with DP-DM's clipped, noised means."""

from __future__ import annotations

import copy

import pytest
import torch

from driftfl.common.augment import DEFAULT_TRANSFORMS, SiameseAugment, parse_transforms
from driftfl.common.models import build_model
from driftfl.dcfl.condense import (CondenseConfig, FreshNetworks, _Condenser, _fresh_network,
                                   _seed)
from driftfl.dcfl.settings import PrivacyPlan

SHAPE, CLASSES, IPC = (1, 28, 28), [0, 2, 3], 3


pytestmark = pytest.mark.usefixtures("one_thread")


def client(seed: int = 0):
    """Classes 0, 2 and 3 of 10, with 30, 9 and 17 images (one smaller than a real batch)."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.tensor([0] * 30 + [2] * 9 + [3] * 17)
    x = torch.randn(len(y), *SHAPE, generator=gen)
    pools = [torch.nonzero(y == c).flatten() for c in CLASSES]
    syn = torch.randn(len(CLASSES) * IPC, *SHAPE, generator=gen).requires_grad_(True)
    return x, pools, syn


def per_class_loss(x, pools, syn, net, augment, generator, real_per_class, privacy=None):
    """The authors' DM loss (VICO-UoE/DatasetCondensation, main_DM.py): class by class, the
    real batch and the synthetic images of a class augmented with one seed, each embedded on
    its own. The draws in the order the batched loop makes them: every class's real batch,
    then every class's augmentation seed, then (DP-DM) every class's noise."""
    if privacy is None:
        batches = [p[torch.randperm(len(p), generator=generator)[:real_per_class]]
                   for p in pools]
    else:
        batches = [p[torch.rand(len(p), generator=generator) < privacy.rates[c]]
                   for c, p in zip(CLASSES, pools)]
    seeds = [_seed(generator) for _ in batches] if augment is not None else [None] * len(pools)
    real_means, syn_means = [], []
    for k, (idx, seed) in enumerate(zip(batches, seeds)):
        real, own = x[idx], syn[k * IPC:(k + 1) * IPC]
        if augment is not None:
            real, own = augment(real, seed), augment(own, seed)
        with torch.no_grad():
            embedded = net.features(real).flatten(1)
        if privacy is None:
            real_means.append(embedded.mean(0))
        else:
            real_means.append(embedded)
        syn_means.append(net.features(own).flatten(1).mean(0))
    if privacy is not None:
        noised = []
        for c, pool, embedded in zip(CLASSES, pools, real_means):
            clipped = embedded * torch.clamp(
                privacy.clip / (embedded.norm(dim=1, keepdim=True) + 1e-12), max=1.0)
            noise = torch.randn(embedded.shape[1], generator=generator)
            noised.append((clipped.sum(0) + noise * privacy.noise[c] * privacy.clip)
                          / (privacy.rates[c] * len(pool)))
        real_means = noised
    return sum(((r - s) ** 2).sum() for r, s in zip(real_means, syn_means))


def batched_loss(x, pools, syn, net, augment, generator, real_per_class, privacy=None):
    config = CondenseConfig(ipc=IPC, real_per_class=real_per_class)
    return _Condenser(x, pools, CLASSES, syn, config, augment, generator, privacy).dm_loss(net)


def loss_and_grad(loss_of, syn, *args):
    loss = loss_of(*args)
    (grad,) = torch.autograd.grad(loss, syn)
    return loss.detach(), grad


@pytest.mark.parametrize("model", ["mlp", "lenet5", "cnn"])
@pytest.mark.parametrize("transforms", [None, DEFAULT_TRANSFORMS, "crop", "scale_rotate"])
def test_the_batched_pass_gives_the_per_class_loss_and_gradient(model, transforms):
    x, pools, syn = client()
    net = build_model({"name": model}, SHAPE, 10).requires_grad_(False)
    for seed in range(3):  # different real batches and transforms each time
        results = [loss_and_grad(f, syn, x, pools, syn, net,
                                 SiameseAugment(parse_transforms(transforms))
                                 if transforms else None,
                                 torch.Generator().manual_seed(seed), 12)
                   for f in (per_class_loss, batched_loss)]
        (loss, grad), (batched, batched_grad) = results
        assert batched == pytest.approx(float(loss), rel=1e-5)
        assert torch.allclose(batched_grad, grad, rtol=1e-4, atol=1e-7)


def test_dp_dm_batched_gives_the_per_class_noised_loss():
    """DP-DM's mechanism per class is unchanged: each embedding clipped to C, the class's sum
    noised with N(0, sigma_c^2 C^2) and divided by q_c n_c, from the same draws."""
    x, pools, syn = client(1)
    plan = PrivacyPlan(clip=0.5, delta=1e-5, iterations=1, rates={0: 0.4, 2: 1.0, 3: 0.6},
                       noise={0: 1.5, 2: 3.0, 3: 0.7}, epsilons={0: 1.0, 2: 1.0, 3: 1.0})
    net = build_model({"name": "mlp"}, SHAPE, 10).requires_grad_(False).eval()
    augment = SiameseAugment(parse_transforms(DEFAULT_TRANSFORMS))
    for seed in range(3):
        (loss, grad), (batched, batched_grad) = [
            loss_and_grad(f, syn, x, pools, syn, net, augment,
                          torch.Generator().manual_seed(seed), 12, plan)
            for f in (per_class_loss, batched_loss)]
        assert batched == pytest.approx(float(loss), rel=1e-5)
        assert torch.allclose(batched_grad, grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("model", ["mlp", "lenet5", "cnn", "convnet"])
def test_fresh_networks_reset_in_place_to_the_networks_a_build_gives(model):
    """One network re-initialised per iteration, equal to building one from the same draw."""
    def make():
        return build_model({"name": model}, SHAPE, 10)

    networks = FreshNetworks(make, torch.Generator().manual_seed(5), torch.device("cpu"))
    built = torch.Generator().manual_seed(5)
    first = networks()
    for _ in range(3):
        expected = _fresh_network(make, built, torch.device("cpu")).state_dict()
        got = networks().state_dict() if _ else first.state_dict()
        assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert networks.net is first  # reset in place, never rebuilt


def test_a_network_whose_build_a_reset_does_not_repeat_is_built_anew():
    """A make_network that hands out copies of one fixed network (or any custom initialisation
    reset_parameters would not repeat) fails the check: every iteration builds."""
    fixed = build_model({"name": "mlp"}, SHAPE, 10)
    networks = FreshNetworks(lambda: copy.deepcopy(fixed), torch.Generator().manual_seed(0),
                             torch.device("cpu"))
    nets = [networks() for _ in range(3)]
    assert networks.net is None and len({id(n) for n in nets}) == 3
    assert all(torch.equal(n.features[1].weight, fixed.features[1].weight) for n in nets)
