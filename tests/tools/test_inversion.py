"""benchmarks/inversion.py: its image-quality measures, the exact first-layer attack on the MLP
with and without DP noise, iDLG's label, the optimisation attack's code path, and the noise
scale of every privacy mode's view."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch
from conftest import REPO

SCRIPT = REPO / "benchmarks" / "inversion.py"
spec = importlib.util.spec_from_file_location("inversion_benchmark", SCRIPT)
inversion = importlib.util.module_from_spec(spec)
spec.loader.exec_module(inversion)

MEAN, STD = 0.286, 0.353  # Fashion-MNIST's pixel mean and std


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def blobs(n: int, seed: int = 0) -> torch.Tensor:
    """Smooth random images (N, 1, 28, 28) in [0, 1]: 7x7 blocks of 4x4 pixels."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 1, size=(n, 1, 7, 7))
    return torch.from_numpy(np.kron(coarse, np.ones((1, 1, 4, 4)))).float()


def model(name: str, seed: int = 0):
    torch.manual_seed(seed)
    return inversion.build_model({"name": name}, (1, 28, 28), 10)


def update_of(net, pixels: torch.Tensor, labels, batch=None):
    return inversion.client_update(net, (pixels - MEAN) / STD, torch.tensor(labels), batch, 0)


def first_layer_psnr(net, update, pixels: torch.Tensor) -> torch.Tensor:
    candidates = (inversion.first_layer_candidates(net, update) * STD + MEAN).clamp(0, 1)
    return inversion.psnr(inversion.closest(candidates, pixels), pixels)


def test_identical_images_score_ssim_one_and_infinite_psnr():
    x = blobs(3)
    assert torch.isinf(inversion.psnr(x, x)).all()
    assert inversion.ssim(x, x) == pytest.approx(torch.ones(3), abs=1e-6)


def test_known_mse_and_a_constant_shift_give_known_values():
    a = torch.full((1, 1, 28, 28), 0.5)
    b = a + 0.1  # MSE 0.01: 20 dB
    assert inversion.psnr(a, b).item() == pytest.approx(20.0, abs=1e-4)
    # flat images: no variance, so SSIM is the luminance term alone
    c1 = 0.01 ** 2
    assert inversion.ssim(a, b).item() == pytest.approx((2 * .5 * .6 + c1) / (.25 + .36 + c1),
                                                        abs=1e-6)
    assert inversion.ssim(blobs(1, 1), blobs(1, 2)).item() < 0.5  # unrelated images


def test_matching_undoes_a_permutation_and_closest_picks_the_nearest():
    real = blobs(6)
    recon = real[[4, 0, 5, 1, 3, 2]] + 0.01
    assert torch.equal(recon[inversion.match(recon, real)], real + 0.01)
    candidates = torch.cat([blobs(20, 7), real[[2]] + 0.01])
    assert torch.equal(inversion.closest(candidates, real[[2]]), real[[2]] + 0.01)


def test_a_one_step_update_is_minus_lr_times_the_gradient():
    """driftfl's local training from conf/config.yaml: the first step with momentum is SGD's."""
    net = model("lenet5")
    x, y = (blobs(1) - MEAN) / STD, torch.tensor([3])
    update = update_of(net, blobs(1), [3])
    loss = torch.nn.functional.cross_entropy(net(x), y)
    lr = inversion.local_defaults()["lr"]
    for u, g in zip(update, torch.autograd.grad(loss, list(net.parameters()))):
        np.testing.assert_allclose(u, -lr * g.numpy(), atol=1e-6)


@pytest.mark.parametrize("images", [1, 8])
def test_the_first_layer_attack_recovers_every_mlp_input_of_one_step(images):
    net = model("mlp")
    pixels = blobs(images, images)
    update = update_of(net, pixels, list(range(images)))
    assert (first_layer_psnr(net, update, pixels) > 100).all()
    # clipped, here far below its norm: the ratio dW_i / db_i is scale-free
    clipped, norm = inversion.clip_update(update, 1e-3)
    assert norm > 0.01 and (first_layer_psnr(net, clipped, pixels) > 100).all()


def test_an_update_that_moved_nothing_leaves_the_first_layer_attack_the_mean_pixel():
    net = model("mlp")
    zero = [np.zeros(p.shape, np.float32) for p in net.parameters()]
    assert torch.equal(inversion.first_layer_candidates(net, zero), torch.zeros(1, 1, 28, 28))


def test_the_first_layer_attack_gets_nowhere_through_one_noisy_share():
    net = model("mlp")
    pixels = blobs(8, 3)
    update = update_of(net, pixels, list(range(8)))
    share = inversion.observe("distributed-share", update, [], np.random.default_rng())
    flat = inversion.psnr(torch.full_like(pixels, MEAN), pixels)
    scores = first_layer_psnr(net, share, pixels)
    assert (scores < 20).all() and scores.mean() < flat.mean() + 3, (scores, flat)


def test_idlg_reads_the_label_off_a_plain_update():
    for name in ("lenet5", "cnn"):
        net = model(name)
        for label in (0, 3, 9):
            assert inversion.idlg_label(net, update_of(net, blobs(1, label), [label])) == label


def test_the_optimisation_attack_runs_and_keeps_the_pixel_box():
    net = model("lenet5")
    pixels = blobs(2, 5)
    updates = [update_of(net, pixels[[i]], [i]) for i in range(2)]
    flat = torch.stack([torch.cat([torch.from_numpy(a).flatten() for a in u]) for u in updates])
    box = (-MEAN / STD, (1 - MEAN) / STD)
    dummies = inversion.invert(net, flat, torch.tensor([[0], [1]]), (1, 1, 28, 28), box,
                               iterations=8, restarts=2, chunk=3)
    assert dummies.shape == (2, 1, 1, 28, 28)
    assert dummies.min() >= box[0] and dummies.max() <= box[1]


def test_the_optimisation_attack_recovers_an_image_without_dp_but_not_through_a_share():
    """On driftfl's cnn (a random init, 100 iterations): measured 20 dB, and 9 dB through a
    share against a flat image's 9 dB."""
    net = model("cnn")
    pixels = blobs(1, 5)
    update = update_of(net, pixels, [2])
    box = (-MEAN / STD, (1 - MEAN) / STD)
    scores = []
    for view in ("none", "distributed-share"):
        seen = inversion.observe(view, update, [], np.random.default_rng())
        flat = torch.cat([torch.from_numpy(a).flatten() for a in seen])[None]
        dummy = inversion.invert(net, flat, torch.tensor([[2]]), (1, 1, 28, 28), box,
                                 iterations=100, tv_weight=0.01)
        scores.append(inversion.psnr((dummy[0] * STD + MEAN).clamp(0, 1), pixels).item())
    floor = inversion.psnr(torch.full_like(pixels, MEAN), pixels).item()
    assert scores[0] > 15 and scores[1] < floor + 3, (scores, floor)


def test_every_view_has_its_stated_noise_scale():
    zero = [np.zeros((400, 500), np.float32)]  # 200,000 coordinates: the std to within 1 %
    others = [zero] * (inversion.CLIENTS - 1)
    stated = {"none": 0, "central-server": 0, "central-published": 1 / 10,
              "distributed-share": 1 / math.sqrt(8), "secagg-sum": math.sqrt(10 / 8)}
    for view, std in stated.items():
        assert inversion.noise_std(view) == pytest.approx(std)
        seen = inversion.observe(view, zero, others, np.random.default_rng())[0]
        assert seen.std() == pytest.approx(std, rel=0.01, abs=1e-9), view


def test_without_noise_the_views_are_the_clipped_update_its_mean_and_sum(monkeypatch):
    monkeypatch.setattr(inversion, "SIGMA", 0.0)
    rng = np.random.default_rng(0)
    target = [rng.normal(size=(30, 4)) * 2]  # norm about 22: clipped to 1
    others = [[rng.normal(size=(30, 4)) * 0.01] for _ in range(inversion.CLIENTS - 1)]
    clipped = [u[0] / max(1.0, np.linalg.norm(u[0])) for u in [target, *others]]

    def seen(view):
        return inversion.observe(view, target, others, rng)[0]

    np.testing.assert_array_equal(seen("none"), target[0])
    np.testing.assert_allclose(seen("central-server"), clipped[0], rtol=1e-6)
    np.testing.assert_allclose(seen("distributed-share"), clipped[0], rtol=1e-6)
    np.testing.assert_allclose(seen("central-published"), np.mean(clipped, 0), rtol=1e-6)
    np.testing.assert_allclose(seen("secagg-sum"), np.sum(clipped, 0), rtol=1e-6)


def test_attack_settings_take_one_number_or_one_per_model():
    settings = inversion.attack_settings("500", "cnn=0.2", 3)
    assert {s["iterations"] for s in settings.values()} == {500}
    assert settings["cnn"]["tv_weight"] == 0.2
    assert settings["lenet5"]["tv_weight"] == inversion.ATTACK["lenet5"]["tv_weight"]
    assert settings["lenet5"]["restarts"] == 3
