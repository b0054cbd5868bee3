"""What one client's model update reveals: a gradient-inversion attack, without and with DP.

One client holds a batch of B real Fashion-MNIST images (B = 1 and 8) and takes one local SGD
step (lr 0.05, driftfl's default; the first step of SGD with momentum is the same step) from a
seeded, randomly initialised model; the server sees its update delta = w_after - w_before =
-lr * gradient. Under DP the client first clips delta to L2 norm C = 1 (driftfl's default
privacy.clip) and adds its share of the noise under privacy=distributed with m = 10 clients,
N(0, (sigma C)^2 / m) on every coordinate, with driftfl's own clip_update and add_noise.

The victims: driftfl's lenet5 (ReLU, max-pooling) at PyTorch's default init, and the same
network with Sigmoid for every ReLU and DLG's init, U(-0.5, 0.5) for every weight: DLG's nets
were smooth, and a ReLU network's gradient is piecewise in the input, which the attack's
optimiser finds harder.

The attack is "inverting gradients" (Geiping et al., 2020): optimise dummy images with Adam
(lr 0.1, cut tenfold at 3/8, 5/8 and 7/8 of the iterations) so that the cosine distance between
their gradient (all layers as one vector) and the observed update is smallest, plus a weighted
total-variation prior, pixels boxed to [0, 1]. Cosine is scale invariant, so clipping costs
the attacker nothing and only the noise is in its way. Labels: for B = 1 iDLG's trick (the one row
of the head's update whose sum is positive: softmax minus one-hot is negative only at the
label, and the features feeding the head are non-negative); for B = 8 the attacker is given the
labels (the strongest attacker). Quality per image on [0, 1] pixels: PSNR and SSIM (11x11
Gaussian window, sigma 1.5), each reconstruction matched to one real image of the batch by
Hungarian matching on the MSE.

    PYTHONPATH=. .venv/bin/python benchmarks/inversion.py [--out DIR] [--iterations N] [--seed S]
    # and --models, --batches, --sigmas (e.g. none,0.001), --tv: comma lists, see --help

The default command (12 attacks of 2,000 iterations) takes about 5 minutes on 2 busy cores,
one torch thread; docs/results.md has its table.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from driftfl.common.models import build_model  # noqa: E402
from driftfl.common.privacy import PrivacySettings, add_noise, clip_update  # noqa: E402

LR, CLIENTS = 0.05, 10  # driftfl's client lr; clients per round whose noise shares add up


# --- quality -----------------------------------------------------------------------------------

def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per image of (N, C, H, W) in [0, 1]: 10 log10(1 / MSE), inf for identical images."""
    mse = ((a - b) ** 2).flatten(1).mean(1)
    return 10 * torch.log10(1 / mse)


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    t = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-t ** 2 / (2 * sigma ** 2))
    g = g / g.sum()
    return (g[:, None] * g[None, :])[None, None]


def ssim(a: torch.Tensor, b: torch.Tensor, size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    """Per image of (N, C, H, W) in [0, 1]: the mean SSIM (Wang et al., 2004) over the valid
    windows, per channel then averaged; K1 0.01, K2 0.03, dynamic range 1."""
    a, b = a.double(), b.double()
    c = a.shape[1]
    w = _gaussian_window(size, sigma).expand(c, 1, size, size)

    def blur(x):
        return F.conv2d(x, w, groups=c)

    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a ** 2
    var_b = blur(b * b) - mu_b ** 2
    cov = blur(a * b) - mu_a * mu_b
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2))
    return s.flatten(1).mean(1).float()


def match(recon: torch.Tensor, real: torch.Tensor) -> np.ndarray:
    """For each real image, the index of the reconstruction assigned to it (Hungarian on MSE)."""
    from scipy.optimize import linear_sum_assignment

    cost = ((real.flatten(1)[:, None] - recon.flatten(1)[None]) ** 2).mean(2)
    rows, cols = linear_sum_assignment(cost.numpy())
    return cols[np.argsort(rows)]


# --- the victim and the attack -----------------------------------------------------------------

def victim_model(name: str, seed: int) -> nn.Module:
    """driftfl's lenet5, or the same with Sigmoid for every ReLU (smooth: DLG's original nets)."""
    torch.manual_seed(seed)
    model = build_model({"name": "lenet5"}, (1, 28, 28), 10)
    if name == "lenet5-sigmoid":
        for parent in model.modules():
            for key, child in parent.named_children():
                if isinstance(child, nn.ReLU):
                    setattr(parent, key, nn.Sigmoid())
        for param in model.parameters():  # DLG's init: the sigmoids do not sit at 0.5
            nn.init.uniform_(param, -0.5, 0.5)
    return model.eval()


def gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor, graph: bool = False):
    loss = F.cross_entropy(model(x), y)
    return torch.autograd.grad(loss, list(model.parameters()), create_graph=graph)


def observed_update(model, x, y, sigma: float | None, rng: np.random.Generator | None):
    """What the server sees, -lr * gradient, clipped and noised as driftfl's client does under
    privacy=distributed; and the update's norm and the noise's std per coordinate."""
    update = [(-LR * g).numpy() for g in gradient(model, x, y)]
    norm = float(np.sqrt(sum((u.astype(np.float64) ** 2).sum() for u in update)))
    if sigma is None:
        return update, norm, 0.0
    privacy = PrivacySettings(name="distributed", noise_multiplier=sigma)
    std = privacy.share_noise_std(CLIENTS)
    clipped, _ = clip_update(update, privacy.clip)
    return add_noise(clipped, std, rng), norm, std


def idlg_label(update: list[np.ndarray], model: nn.Module) -> int:
    """The row of the head's weight update with the largest sum (the gradient's is negative)."""
    names = [n for n, _ in model.named_parameters()]
    head = update[names.index("head.weight")]
    return int(head.sum(1).argmax())


def tv(x: torch.Tensor) -> torch.Tensor:
    return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., 1:] - x[..., :-1]).abs().mean()


def invert(model, update, labels, shape, lo, hi, iterations: int, seed: int,
           tv_weight: float = 0.003, log_every: int = 0) -> torch.Tensor:
    """Dummy images (normalised) whose gradient points along ``update`` (cosine + TV)."""
    target = torch.cat([-torch.as_tensor(u, dtype=torch.float32).flatten() for u in update])
    target = target / target.norm().clamp_min(1e-12)
    generator = torch.Generator().manual_seed(seed)
    dummy = torch.randn(shape, generator=generator).clamp(lo, hi).requires_grad_(True)
    optimiser = torch.optim.Adam([dummy], lr=0.1)
    schedule = torch.optim.lr_scheduler.MultiStepLR(
        optimiser, [int(iterations * f) for f in (0.375, 0.625, 0.875)], gamma=0.1)
    for it in range(1, iterations + 1):
        optimiser.zero_grad()
        grads = torch.cat([g.flatten() for g in gradient(model, dummy, labels, graph=True)])
        distance = 1 - grads @ target / grads.norm().clamp_min(1e-12)
        loss = distance + tv_weight * tv(dummy)
        loss.backward()
        optimiser.step()
        schedule.step()
        with torch.no_grad():
            dummy.clamp_(lo, hi)
        if log_every and (it % log_every == 0 or it == iterations):
            print(f"      iteration {it:>5}  cosine distance {distance.item():.4f}  "
                  f"loss {loss.item():.4f}", flush=True)
    return dummy.detach()


# --- the benchmark -----------------------------------------------------------------------------

def save_png(real: np.ndarray, recon: np.ndarray, scores: list[str], path: Path, title: str):
    """Top row the client's images, bottom row each one's matched reconstruction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(real)
    fig, axes = plt.subplots(2, n, figsize=(max(2.2, 0.8 * n), 2.5), squeeze=False)
    for i in range(n):
        for row, image in enumerate((real[i], recon[i])):
            ax = axes[row][i]
            ax.imshow(image, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
        axes[1][i].set_xlabel(scores[i], fontsize=6)
    axes[0][0].set_ylabel("real", fontsize=7)
    axes[1][0].set_ylabel("attack", fontsize=7)
    fig.suptitle(title, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    from PIL import Image  # matplotlib's own dependency

    Image.open(path).convert("L").save(path, optimize=True)  # grey: half the bytes of RGBA


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/driftfl-inversion"),
                        help="where the PNGs go (default %(default)s)")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--tv", type=float, default=0.003, help="total-variation weight")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", default="lenet5-sigmoid,lenet5")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--sigmas", default="none,0.01,1.0",
                        help="noise multipliers; none: no DP (no clipping, no noise)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)

    from driftfl.common.datasets import load_dataset

    data = load_dataset({"name": "fmnist"})
    mean, std = float(data.mean[0]), float(data.std[0])
    lo, hi = (0 - mean) / std, (1 - mean) / std  # the pixel box [0, 1], normalised
    rng = np.random.default_rng(args.seed)
    batches = {int(b): rng.choice(len(data.train_y), int(b), replace=False)
               for b in args.batches.split(",")}  # the same images for every model
    rows = []
    for model_name in args.models.split(","):
        model = victim_model(model_name, args.seed)
        for b, index in batches.items():
            pixels = torch.from_numpy(data.train_x[index]).float() / 255
            x, y = (pixels - mean) / std, torch.from_numpy(data.train_y[index]).long()
            for level in args.sigmas.split(","):
                sigma = None if level == "none" else float(level)
                update, norm, noise = observed_update(model, x, y, sigma,
                                                      np.random.default_rng(args.seed))
                noise_norm = noise * math.sqrt(sum(u.size for u in update))
                label = "known"
                labels = y
                if b == 1:
                    guess = idlg_label(update, model)
                    labels = torch.tensor([guess])
                    label = "right" if guess == int(y[0]) else "wrong"
                setting = f"{model_name} B={b}: " + ("no DP" if sigma is None else
                                                    f"sigma={sigma:g} (std {noise:.4g})")
                print(f"{setting}; update norm {norm:.3g}, noise norm {noise_norm:.3g}, "
                      f"labels {label}", flush=True)
                started = time.perf_counter()
                dummy = invert(model, update, labels, tuple(x.shape), lo, hi, args.iterations,
                               args.seed, args.tv, log_every=max(1, args.iterations // 4))
                seconds = time.perf_counter() - started
                recon = (dummy * std + mean).clamp(0, 1)
                order = match(recon, pixels)
                recon = recon[order]
                p, s = psnr(recon, pixels), ssim(recon, pixels)
                rows.append((model_name, b, "none" if sigma is None else f"{sigma:g}", noise,
                             f"{norm:.3g} / {noise_norm:.3g}", label, p.mean().item(),
                             s.mean().item(), seconds))
                tag = "nodp" if sigma is None else f"sigma{sigma:g}"
                save_png(pixels[:, 0].numpy(), recon[:, 0].numpy(),
                         [f"{a:.1f} dB\nSSIM {c:.2f}" for a, c in zip(p.tolist(), s.tolist())],
                         args.out / f"{model_name}-b{b}-{tag}.png",
                         setting.replace(": ", "\n", 1) + f", {args.iterations} iterations")
    print(f"\n{args.iterations} iterations, TV weight {args.tv:g}, seed {args.seed}; PNGs in "
          f"{args.out}")
    print("| model | B | sigma | noise std per coordinate | update norm / noise norm | labels "
          "| PSNR (dB) | SSIM | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m, b, sg, noise, norms, label, p, s, sec in rows:
        print(f"| {m} | {b} | {sg} | {noise:.4g} | {norms} | {label} | {p:.1f} | {s:.3f} "
              f"| {sec:.0f} |")
    for b, index in batches.items():  # the floor: no attack, a flat image at the mean pixel
        pixels = torch.from_numpy(data.train_x[index]).float() / 255
        flat = torch.full_like(pixels, mean)
        print(f"reference, B={b}: a flat image at the dataset's mean pixel scores "
              f"{psnr(flat, pixels).mean():.1f} dB, SSIM {ssim(flat, pixels).mean():.3f}")


if __name__ == "__main__":
    main()
