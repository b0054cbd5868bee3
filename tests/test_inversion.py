"""benchmarks/inversion.py: its image-quality measures on hand-made cases, iDLG's label, and
that the attack recovers more of an image from a plain update than from a DP-noised one."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from conftest import REPO

SCRIPT = REPO / "benchmarks" / "inversion.py"
spec = importlib.util.spec_from_file_location("inversion_benchmark", SCRIPT)
inversion = importlib.util.module_from_spec(spec)
spec.loader.exec_module(inversion)


def blobs(n: int, seed: int = 0) -> torch.Tensor:
    """Smooth random images (N, 1, 28, 28) in [0, 1]: 7x7 blocks of 4x4 pixels."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 1, size=(n, 1, 7, 7))
    return torch.from_numpy(np.kron(coarse, np.ones((1, 1, 4, 4)))).float()


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


def test_matching_undoes_a_permutation():
    real = blobs(6)
    recon = real[[4, 0, 5, 1, 3, 2]] + 0.01
    assert torch.equal(recon[inversion.match(recon, real)], real + 0.01)


def test_idlg_reads_the_label_off_a_plain_update_for_both_models():
    for name in ("lenet5", "lenet5-sigmoid"):
        model = inversion.victim_model(name, 0)
        for label in (0, 3, 9):
            update, _, _ = inversion.observed_update(model, (blobs(1, label) - 0.3) / 0.35,
                                                     torch.tensor([label]), None, None)
            assert inversion.idlg_label(update, model) == label


def test_the_attack_sees_more_without_dp_than_through_sigma_one():
    torch.set_num_threads(1)
    model = inversion.victim_model("lenet5-sigmoid", 0)
    mean, std = 0.3, 0.35
    lo, hi = -mean / std, (1 - mean) / std
    pixels = blobs(1, 5)
    x, y = (pixels - mean) / std, torch.tensor([2])
    scores = []
    for sigma in (None, 1.0):
        update, norm, noise = inversion.observed_update(model, x, y, sigma,
                                                        np.random.default_rng(0))
        dummy = inversion.invert(model, update, y, tuple(x.shape), lo, hi, 300, 0)
        scores.append(inversion.psnr((dummy * std + mean).clamp(0, 1), pixels).item())
    assert noise == pytest.approx(1.0 / np.sqrt(10))  # sigma C / sqrt(m), C = 1, m = 10
    assert scores[0] > 10 and scores[0] > scores[1] + 4, scores  # measured: 12.8 and 7.0
