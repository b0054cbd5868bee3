"""Differentiable Siamese Augmentation and client-side dataset condensation (DM, DC, DSA)."""

from __future__ import annotations

import copy

import pytest
import torch

from driftfl.dcfl.condense import CondenseConfig, _distance, condense, progress_line
from driftfl.common.augment import (DEFAULT_TRANSFORMS, DSA_TRANSFORMS, SiameseAugment,
                                    parse_transforms)
from driftfl.common.errors import ConfigError
from driftfl.common.models import mlp

SHAPE = (1, 8, 8)


def images(n: int = 6, channels: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, channels, 8, 8, generator=torch.Generator().manual_seed(seed))


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, torch.Tensor]:
    """3 classes x 40 noisy 1x8x8 images around a class-specific pattern."""
    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(3, *SHAPE, generator=gen)
    y = torch.arange(3).repeat_interleave(40)
    return centres[y] + 0.7 * torch.randn(len(y), *SHAPE, generator=gen), y


def network():
    return mlp(SHAPE, 3, hidden=(16,))


def run(x, y, seed=0, augment=None, progress=None, **config):
    return condense(x, y, 3, CondenseConfig(**config), make_network=network, augment=augment,
                    generator=torch.Generator().manual_seed(seed), progress=progress)


def fixed_networks(count: int = 4):
    nets = []
    for seed in range(count):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1000 + seed)
            nets.append(network())
    return nets


# --- augmentation -------------------------------------------------------------------------------

def test_parse_transforms():
    assert parse_transforms(DEFAULT_TRANSFORMS) == DSA_TRANSFORMS
    assert parse_transforms("flip") == ("flip",)
    with pytest.raises(ConfigError) as err:
        parse_transforms("color_blur")
    assert str(err.value) == ("unknown DSA transform 'blur' in 'color_blur'; "
                              "valid: color, crop, cutout, flip, scale, rotate")
    with pytest.raises(ConfigError, match="valid:"):
        parse_transforms("color__crop")


@pytest.mark.parametrize("family", DSA_TRANSFORMS)
def test_siamese_same_seed_same_transform(family):
    aug, x = SiameseAugment((family,)), images()
    for seed in range(8):
        for per_sample in (False, True):
            assert torch.equal(aug(x, seed, per_sample=per_sample),
                               aug(x.clone(), seed, per_sample=per_sample))
        # one parameter set per batch: a smaller batch gets exactly the same transform
        assert torch.equal(aug(x[:2], seed), aug(x, seed)[:2])
        assert torch.equal(aug(x[3:4], seed), aug(x, seed)[3:4])


@pytest.mark.parametrize("family", DSA_TRANSFORMS)
def test_seeds_differ_and_global_rng_untouched(family):
    aug, x = SiameseAugment((family,)), images()
    state = torch.get_rng_state()
    outputs = [aug(x, seed) for seed in range(10)]
    assert any(not torch.equal(outputs[0], other) for other in outputs[1:])
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("family", ["crop", "cutout", "flip", "scale", "rotate"])
def test_per_sample_transforms_each_image(family):
    aug = SiameseAugment((family,))
    x = images(1).expand(8, -1, -1, -1).contiguous()
    shared = aug(x, 5)
    assert all(torch.equal(shared[0], shared[i]) for i in range(8))
    assert any(not torch.equal(out[0], out[i])
               for out in (aug(x, s, per_sample=True) for s in range(4)) for i in range(8))


@pytest.mark.parametrize("family", DSA_TRANSFORMS)
@pytest.mark.parametrize("channels", [1, 3])
def test_gradients_reach_pixels(family, channels):
    aug = SiameseAugment((family,))
    for seed in range(3):
        x = images(4, channels).requires_grad_(True)
        (aug(x, seed) ** 2).sum().backward()
        assert x.grad is not None and x.grad.abs().sum() > 0


def test_saturation_is_a_no_op_on_grey_images():
    """With one channel, colour is brightness then contrast: a per-image affine map of pixels."""
    x = images(3, 1)
    out = SiameseAugment(("color",))(x, 7)
    slope = (out[:, :, 0, 1] - out[:, :, 0, 0]) / (x[:, :, 0, 1] - x[:, :, 0, 0])
    offset = out[:, :, 0, 0] - slope * x[:, :, 0, 0]
    assert torch.allclose(out, slope.view(-1, 1, 1, 1) * x + offset.view(-1, 1, 1, 1), atol=1e-5)


def test_crop_translates_by_whole_pixels():
    x = torch.arange(1.0, 65.0).view(1, 1, 8, 8)
    for seed in range(10):
        out = SiameseAugment(("crop",))(x, seed)
        kept = out[out != 0]
        assert set(kept.tolist()) <= set(x.flatten().tolist()) and len(kept) >= 7 * 7 - 1


# --- condensation -------------------------------------------------------------------------------

def test_distance_is_one_minus_cosine_per_row_ignoring_biases():
    g = [torch.randn(4, 5), torch.randn(4)]
    assert _distance(g, g).abs() < 1e-5
    assert torch.allclose(_distance([-g[0], g[1]], [g[0], -g[1]]), torch.tensor(8.0), atol=1e-4)


def test_shapes_labels_and_initialisation():
    x, y = images(13, 1, seed=3), torch.tensor([0] * 10 + [2] * 3)
    syn_x, syn_y = condense(x, y, 4, CondenseConfig(ipc=5, iterations=1, lr=0.0, init="real"),
                            make_network=lambda: mlp(SHAPE, 4, hidden=(8,)), augment=None,
                            generator=torch.Generator().manual_seed(0))
    assert syn_x.shape == (10, *SHAPE) and syn_x.dtype == torch.float32
    assert syn_y.dtype == torch.int64 and syn_y.tolist() == [0] * 5 + [2] * 5
    # with lr 0 the images are the initial ones: real images of their own class, all different
    # where the class has enough of them
    for image, label in zip(syn_x, syn_y):
        assert any(torch.equal(image, real) for real in x[y == label])
    assert len({tuple(image.flatten().tolist()) for image in syn_x[:5]}) == 5


def test_real_ships_distinct_random_real_images_of_each_held_class_and_learns_nothing():
    """condensation=real (the ablation bounding what condensed images could do): ipc distinct
    real images of each class holding at least min_class, none of a class below it, drawn by
    the generator, whatever init and lr say; no network is built."""
    x, y = images(33, 1, seed=3), torch.tensor([0] * 20 + [1] * 3 + [2] * 10)

    def real(seed):
        return condense(x, y, 3, CondenseConfig(method="real", ipc=5, min_class=5, lr=9.0),
                        make_network=lambda: pytest.fail("no network for real images"),
                        augment=None, generator=torch.Generator().manual_seed(seed))

    shipped, labels = real(0)
    assert labels.tolist() == [0] * 5 + [2] * 5 and not shipped.requires_grad
    for image, label in zip(shipped, labels):
        assert any(torch.equal(image, own) for own in x[y == label])
    assert len({tuple(image.flatten().tolist()) for image in shipped}) == 10
    assert torch.equal(real(0)[0], shipped) and not torch.equal(real(1)[0], shipped)


def test_noise_initialisation_starts_from_none_of_the_images():
    """init=noise (the default): with lr 0 the shipped images are N(0, 1) draws, none of them a
    client image nor close to one."""
    x, y = images(40, 1, seed=3), torch.tensor([0] * 20 + [2] * 20)
    syn_x, syn_y = condense(x, y, 4, CondenseConfig(ipc=5, iterations=1, lr=0.0),
                            make_network=lambda: mlp(SHAPE, 4, hidden=(8,)), augment=None,
                            generator=torch.Generator().manual_seed(0))
    assert syn_y.tolist() == [0] * 5 + [2] * 5
    flat = lambda t: (t - t.mean(1, keepdim=True)) / t.std(1, keepdim=True)  # noqa: E731
    correlation = flat(syn_x.flatten(1)) @ flat(x.flatten(1)).T / (x[0].numel() - 1)
    assert correlation.abs().max() < 0.6  # independent 64-pixel images: |r| ~ 0.13
    assert abs(float(syn_x.mean())) < 0.3 and 0.7 < float(syn_x.std()) < 1.3


def test_errors():
    x, y = images(4, 1), torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError, match="dsa"):
        run(x, y, method="dsa", iterations=1)
    with pytest.raises(ConfigError, match="valid: dm, dc, dsa"):
        CondenseConfig(method="kip")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        CondenseConfig(ipc=0)
    with pytest.raises(ConfigError, match="valid: noise, real"):
        CondenseConfig(init="zeros")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="valid: sgd, adam"):
        CondenseConfig(optimizer="lbfgs")  # type: ignore[arg-type]


@pytest.mark.parametrize("optimizer, lr", [("sgd", 1.0), ("adam", 0.05)])
def test_both_optimizers_match_embeddings(data, optimizer, lr):
    x, y = data
    before = run(x, y, ipc=4, iterations=1, lr=0.0, optimizer=optimizer)
    after = run(x, y, ipc=4, iterations=60, real_per_class=40, lr=lr, optimizer=optimizer)
    assert embedding_distance(*after, x, y) < 0.5 * embedding_distance(*before, x, y)


def embedding_distance(syn_x, syn_y, x, y) -> float:
    """Sum over classes of the squared gap between mean embeddings, over fixed networks."""
    total = 0.0
    with torch.no_grad():
        for net in fixed_networks():
            for c in range(3):
                gap = net.features(x[y == c]).mean(0) - net.features(syn_x[syn_y == c]).mean(0)
                total += float((gap ** 2).sum())
    return total


def test_dm_matches_embeddings(data):
    x, y = data
    before = run(x, y, ipc=4, iterations=1, lr=0.0)
    after = run(x, y, ipc=4, iterations=60, real_per_class=40)
    assert embedding_distance(*after, x, y) < 0.5 * embedding_distance(*before, x, y)


def test_dc_lowers_its_matching_loss(data):
    """With every iteration starting from the same network (and all real images in each batch)
    the reported matching loss depends only on the synthetic images, so it must fall."""
    x, y = data
    start = fixed_networks(1)[0]
    losses: list[float] = []
    condense(x, y, 3, CondenseConfig(method="dc", ipc=2, iterations=20, lr=1.0, outer_loop=2,
                                     inner_loop=1, real_per_class=40, log_every=1),
             make_network=lambda: copy.deepcopy(start), augment=None,
             generator=torch.Generator().manual_seed(0),
             progress=lambda _, loss, __: losses.append(loss))
    assert len(losses) == 20 and losses[-1] < 0.85 * losses[0]


@pytest.mark.parametrize("method", ["dm", "dsa"])
def test_deterministic_for_a_generator_seed(data, method):
    x, y = data
    aug = SiameseAugment(parse_transforms(DEFAULT_TRANSFORMS))
    config = dict(method=method, ipc=2, iterations=3, outer_loop=2, inner_loop=2, lr=0.1,
                  real_per_class=16)
    state = torch.get_rng_state()
    first = run(x, y, seed=1, augment=aug, **config)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's RNG is left alone
    torch.manual_seed(123)  # and the global RNG plays no part
    second = run(x, y, seed=1, augment=aug, **config)
    other = run(x, y, seed=2, augment=aug, **config)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert not torch.equal(first[0], other[0])


def test_progress_calls(data):
    x, y = data
    calls: list[tuple[int, float, float]] = []
    run(x, y, ipc=1, iterations=7, log_every=3, real_per_class=8,
        progress=lambda *args: calls.append(args))
    assert [c[0] for c in calls] == [3, 6, 7]
    assert all(isinstance(loss, float) and loss >= 0 for _, loss, _ in calls)
    assert [c[2] for c in calls] == sorted(c[2] for c in calls)


def test_progress_line():
    assert (progress_line(3, 200, 200, 0.0123, 4.13)
            == "condense: client 3 iteration 200/200, matching loss 0.0123, 4.1 s")


def test_a_class_below_min_class_is_not_condensed_and_one_image_would_be_copied(data):
    """Matching the mean embedding of a class's single image drives its synthetic images onto
    that image (near-copies); with min_class such a class is not condensed at all."""
    x, y = data
    lone = torch.randn(1, *SHAPE, generator=torch.Generator().manual_seed(9))
    x, y = torch.cat([x, lone]), torch.cat([y, torch.tensor([3])])
    config = dict(ipc=2, iterations=150, lr=0.1, optimizer="adam", real_per_class=40)
    images, labels = condense(x, y, 4, CondenseConfig(**config), make_network=network4,
                              augment=None, generator=torch.Generator().manual_seed(0))
    flat = lambda t: (t - t.mean(-1, keepdim=True)) / t.std(-1, keepdim=True)  # noqa: E731
    copied = flat(images[labels == 3].flatten(1)) @ flat(lone.flatten(1)).T / (lone.numel() - 1)
    assert copied.min() > 0.95
    images, labels = condense(x, y, 4, CondenseConfig(**config, min_class=2),
                              make_network=network4, augment=None,
                              generator=torch.Generator().manual_seed(0))
    assert labels.tolist() == [0, 0, 1, 1, 2, 2]
    none, nothing = condense(lone, torch.tensor([3]), 4, CondenseConfig(**config, min_class=2),
                             make_network=network4, augment=None,
                             generator=torch.Generator().manual_seed(0))
    assert none.shape == (0, *SHAPE) and nothing.shape == (0,)


def network4():
    return mlp(SHAPE, 4, hidden=(16,))
