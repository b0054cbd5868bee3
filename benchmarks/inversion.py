"""What one client's model update reveals of its images, in each of driftfl's privacy modes.

Victims: driftfl's own ``mlp``, ``lenet5`` and ``cnn``, each trained first (centrally, 2 epochs
on 20,000 Fashion-MNIST training images, seed 0; cached under --checkpoints). A client holds B
other real training images and runs driftfl's own local training on them (train_locally, one
epoch, conf/config.yaml's lr 0.05, momentum 0.9 and batch 32, or batch 8 where a setting says
so); its update is w_after - w_before. Settings: mlp B=1, B=8 (one step each) and B=32 in
batches of 8 (4 steps); lenet5 and cnn B=1 (one step of one image).

What the attacker sees of the target client (sigma = 1, C = 1, m = 10 clients a round,
m_min = 8 survivors; driftfl's clip_update and add_noise, the noise from OS entropy):

- ``none``: the raw update;
- ``central-server``: the clipped update (privacy=central: the trusted server clips it itself);
- ``central-published``: the round's published mean, (sum of the m clipped updates) / m
  + N(0, (sigma C / m)^2) per coordinate; the other m - 1 are other real clients' updates;
- ``distributed-share``: one client's reply without SecAgg+, its clipped update
  + N(0, sigma^2 C^2 / m_min);
- ``secagg-sum``: with SecAgg+, only the sum of the m clients' noisy shares.

Attacks. mlp: the exact first-layer attack. For the first linear layer z = W x + b every step
adds -lr * delta_i * x to row i of W and -lr * delta_i to b_i, so dW_i / db_i is x itself when
one image alone moved row i; every row with db_i != 0 gives a candidate, and each real image is
scored against its closest candidate. lenet5 and cnn: "inverting gradients" (Geiping et al.,
2020): dummy images minimise 1 - cos(their gradient, the observed update) + TV weight * total
variation, by Adam on the signed gradient (lr 0.1, cut tenfold at 3/8, 5/8, 7/8), pixels boxed
to [0, 1]; restarts keep the dummy of lowest loss; the label is iDLG's (the row of the head's
update with the largest sum); lenet5 3,000 iterations at TV weight 0.1, cnn 300 at 0.01 (a cnn
iteration costs some 25 lenet5 ones), one restart. Cosine ignores scale, and so does dW_i / db_i:
clipping costs these attacks nothing.

Scores: per real image, PSNR and SSIM (11x11 Gaussian window, sigma 1.5) of its reconstruction
on [0, 1] pixels; the floor is no attack at all, the mean training image. Each (model, setting,
view, seed) scores --images target images; the table is the mean over seeds.

    PYTHONPATH=. .venv/bin/python benchmarks/inversion.py --out results/inversion \\
        --checkpoints /tmp/driftfl-inversion-checkpoints
    # --models, --views, --seeds: comma lists; --iterations 3000 or lenet5=3000,cnn=600

writes inversion.csv (the table), a PNG per (model, setting, view) of seed 0's first images
(real row above reconstruction row), and prints progress lines and the table. The default run
took 72 min on 2 busy cores, one torch thread; docs/results.md has its table.
"""

from __future__ import annotations

import argparse
import copy
import csv
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from driftfl.common.models import build_model  # noqa: E402
from driftfl.common.privacy import add_noise, clip_update  # noqa: E402
from driftfl.common.training import CrossEntropy, TrainSettings, train_locally  # noqa: E402

SIGMA, CLIP, CLIENTS, SURVIVORS = 1.0, 1.0, 10, 8  # sigma, C, m, m_min
VIEWS = ("none", "central-server", "central-published", "distributed-share", "secagg-sum")
# (images a client holds, its batch size) per model; None: driftfl's default batch
SETTINGS = {"mlp": [(1, None), (8, None), (32, 8)], "lenet5": [(1, None)], "cnn": [(1, None)]}
# the optimisation attack per conv net: its iterations, its TV weight (the best of those tried,
# docs/results.md), and how many targets one vectorised descent takes (vmap gains nothing on
# the cnn, whose per-example gradient of its 3,136 x 512 layer dominates)
ATTACK = {"lenet5": {"iterations": 3000, "tv_weight": 0.1, "chunk": 32},
          "cnn": {"iterations": 300, "tv_weight": 0.01, "chunk": 4}}
SHOWN = 8  # images per PNG
PRETRAIN_IMAGES, PRETRAIN_EPOCHS = 20_000, 2


def local_defaults() -> dict:
    """lr, momentum, weight decay and batch size of conf/config.yaml: a client's training."""
    from omegaconf import OmegaConf

    conf = OmegaConf.load(REPO / "conf" / "config.yaml")
    return {k: conf[k] for k in ("lr", "momentum", "weight_decay", "batch_size")}


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


def closest(candidates: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """For each real image, the candidate of least MSE (candidates may be many more)."""
    cost = ((real.flatten(1)[:, None] - candidates.flatten(1)[None]) ** 2).mean(2)
    return candidates[cost.argmin(1)]


# --- victims and their clients -----------------------------------------------------------------

class Data:
    """Fashion-MNIST, normalised: the victims' pre-training images, and the clients' pool."""

    def __init__(self):
        from driftfl.common.datasets import load_dataset, to_tensors

        data = load_dataset({"name": "fmnist"})
        self.mean, self.std = float(data.mean[0]), float(data.std[0])
        self.x, self.y = to_tensors(data.train_x, data.train_y, data.mean, data.std)
        order = np.random.default_rng(0).permutation(len(self.y))
        self.pretrain, self.pool = order[:PRETRAIN_IMAGES], order[PRETRAIN_IMAGES:]
        self.test_x, self.test_y = to_tensors(data.test_x[:2000], data.test_y[:2000],
                                              data.mean, data.std)

    def pixels(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised images back to [0, 1]."""
        return (x * self.std + self.mean).clamp(0, 1)

    @property
    def box(self) -> tuple[float, float]:
        """The pixel box [0, 1], normalised."""
        return -self.mean / self.std, (1 - self.mean) / self.std

    def mean_image(self) -> torch.Tensor:
        return self.pixels(self.x[self.pool]).mean(0, keepdim=True)


def trained_model(name: str, data: Data, folder: Path) -> nn.Module:
    """driftfl's ``name``, trained centrally and cached in ``folder``: attacks on a network at
    its random init say little about one in use."""
    torch.manual_seed(0)
    model = build_model({"name": name}, (1, 28, 28), 10)
    path = folder / f"{name}.pt"
    if path.exists():
        model.load_state_dict(torch.load(path))
    else:
        conf = local_defaults()
        settings = TrainSettings(PRETRAIN_EPOCHS, 64, conf["lr"], conf["momentum"], 0.0)
        train_locally(model, data.x[data.pretrain], data.y[data.pretrain], settings,
                      CrossEntropy(), torch.Generator().manual_seed(0))
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), path)
    model.eval()
    with torch.no_grad():
        accuracy = (model(data.test_x).argmax(1) == data.test_y).float().mean().item()
    print(f"{name}: trained, test accuracy {accuracy:.1%} on 2,000 test images", flush=True)
    return model


def client_update(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int | None,
                  seed: int) -> list[np.ndarray]:
    """A client's reply before any DP: w_after - w_before after one epoch of driftfl's local
    training on (x, y), per parameter in the model's order."""
    conf = local_defaults()
    settings = TrainSettings(1, batch or conf["batch_size"], conf["lr"], conf["momentum"],
                             conf["weight_decay"])
    local = copy.deepcopy(model)
    train_locally(local, x, y, settings, CrossEntropy(), torch.Generator().manual_seed(seed))
    return [(a.detach() - b.detach()).numpy() for a, b in zip(local.parameters(),
                                                              model.parameters())]


# --- what each privacy mode lets the attacker see ----------------------------------------------

def noise_std(view: str) -> float:
    """The noise's standard deviation per coordinate of each view: sigma C on the sum of the
    clipped updates (central: the server's; distributed: m_min shares of sigma C / sqrt(m_min),
    so the m shares of a round add up to a little more)."""
    share = SIGMA * CLIP / math.sqrt(SURVIVORS)
    return {"none": 0.0, "central-server": 0.0, "central-published": SIGMA * CLIP / CLIENTS,
            "distributed-share": share, "secagg-sum": share * math.sqrt(CLIENTS)}[view]


def observe(view: str, target: list[np.ndarray], others: list[list[np.ndarray]],
            rng: np.random.Generator) -> list[np.ndarray]:
    """What ``view`` shows of the target's update; ``others``: the round's m - 1 other
    clients' raw updates."""
    def clipped(u):
        return clip_update(u, CLIP)[0]

    def share(u):  # a client's reply under privacy=distributed
        return add_noise(clipped(u), noise_std("distributed-share"), rng)

    def total(updates):
        return [np.sum(arrays, axis=0) for arrays in zip(*updates)]

    if view == "none":
        return target
    if view == "central-server":
        return clipped(target)
    if view == "distributed-share":
        return share(target)
    if view == "secagg-sum":
        return total([share(u) for u in [target, *others]])
    if view == "central-published":
        mean = [a / CLIENTS for a in total([clipped(u) for u in [target, *others]])]
        return add_noise(mean, noise_std(view), rng)
    raise ValueError(f"unknown view {view!r}; known: {', '.join(VIEWS)}")


# --- the attacks -------------------------------------------------------------------------------

def first_layer_candidates(model: nn.Module, update: list[np.ndarray]) -> torch.Tensor:
    """dW_i / db_i of the first linear layer, one per row with db_i != 0: (K, 1, 28, 28)
    normalised images (the mean pixel where no row moved)."""
    names = [n for n, _ in model.named_parameters()]
    layer = next(n for n, m in model.named_modules() if isinstance(m, nn.Linear))
    dw = torch.from_numpy(update[names.index(f"{layer}.weight")]).double()
    db = torch.from_numpy(update[names.index(f"{layer}.bias")]).double()
    rows = db != 0
    if not rows.any():  # a client sure of its images moved nothing: the mean pixel is all
        return torch.zeros(1, 1, 28, 28)
    return (dw[rows] / db[rows, None]).float().view(-1, 1, 28, 28)


def idlg_label(model: nn.Module, update: list[np.ndarray]) -> int:
    """The row of the head's weight update with the largest sum: -lr (softmax - one-hot) h^T is
    positive only in the label's row, h (post-ReLU features) being non-negative."""
    names = [n for n, _ in model.named_parameters()]
    return int(update[names.index("head.weight")].sum(1).argmax())


def per_target_gradient(model: nn.Module):
    """f(dummies (T, B, C, H, W), labels (T, B)) -> (T, P): each target's dummy batch's gradient
    of the mean cross-entropy, flattened in the model's parameter order."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def flat(x, y):
        grads = grad(lambda p: F.cross_entropy(functional_call(model, p, (x,)), y))(params)
        return torch.cat([g.flatten() for g in grads.values()])

    return vmap(flat)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Per target of (T, B, C, H, W): mean absolute difference of neighbouring pixels."""
    return ((x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(1)
            + (x[..., 1:] - x[..., :-1]).abs().flatten(1).mean(1))


def _descend(gradient_of, direction, labels, shape, box, iterations, tv_weight, signed,
             generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One dummy batch per row of ``direction``, optimised together (their losses are
    independent, and Adam is per coordinate); returns the dummies and their final losses."""
    dummy = torch.randn((len(direction), *shape), generator=generator).clamp(*box)
    dummy.requires_grad_(True)
    optimiser = torch.optim.Adam([dummy], lr=0.1)
    schedule = torch.optim.lr_scheduler.MultiStepLR(
        optimiser, [int(iterations * f) for f in (0.375, 0.625, 0.875)], gamma=0.1)

    def losses():
        g = gradient_of(dummy, labels)
        cosine = (g * direction).sum(1) / g.norm(dim=1).clamp_min(1e-12)
        return 1 - cosine + tv_weight * total_variation(dummy)

    for _ in range(iterations):
        optimiser.zero_grad()
        losses().sum().backward()
        if signed:  # Geiping et al.'s choice: every pixel moves at Adam's pace
            dummy.grad.sign_()
        optimiser.step()
        schedule.step()
        with torch.no_grad():
            dummy.clamp_(*box)
    with torch.no_grad():
        final = losses()
    return dummy.detach(), final.detach()


def invert(model: nn.Module, updates: torch.Tensor, labels: torch.Tensor, shape, box, *,
           iterations: int, tv_weight: float = 0.01, restarts: int = 1, signed: bool = True,
           chunk: int = 32, seed: int = 0) -> torch.Tensor:
    """Inverting gradients for T targets at once: ``updates`` (T, P) the observed updates
    flattened, ``labels`` (T, B); returns (T, B, *shape) normalised dummies, per target the
    restart of lowest loss."""
    gradient_of = per_target_gradient(model)
    direction = -updates / updates.norm(dim=1, keepdim=True).clamp_min(1e-12)  # -lr * gradient
    direction = direction.repeat_interleave(restarts, 0)
    labels = labels.repeat_interleave(restarts, 0)
    generator = torch.Generator().manual_seed(seed)
    dummies, losses = [], []
    for start in range(0, len(direction), chunk):
        d, loss = _descend(gradient_of, direction[start:start + chunk],
                           labels[start:start + chunk], shape, box, iterations, tv_weight,
                           signed, generator)
        dummies.append(d)
        losses.append(loss)
    dummies = torch.cat(dummies).view(len(updates), restarts, *shape)
    best = torch.cat(losses).view(len(updates), restarts).argmin(1)
    return dummies[torch.arange(len(updates)), best]


# --- the benchmark -----------------------------------------------------------------------------

def save_png(real: torch.Tensor, recon: torch.Tensor, path: Path, title: str) -> None:
    """Top row the client's images, bottom row each one's reconstruction, PSNR below it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image  # matplotlib's own dependency

    scores = psnr(recon, real).tolist()
    n = len(real)
    fig, axes = plt.subplots(2, n, figsize=(max(2.2, 0.8 * n), 2.4), squeeze=False)
    for i in range(n):
        for row, image in enumerate((real[i, 0], recon[i, 0])):
            ax = axes[row][i]
            ax.imshow(image.numpy(), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
        axes[1][i].set_xlabel(f"{scores[i]:.1f} dB", fontsize=6)
    axes[0][0].set_ylabel("real", fontsize=7)
    axes[1][0].set_ylabel("attack", fontsize=7)
    fig.suptitle(title, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    Image.open(path).convert("L").save(path, optimize=True)  # grey: half the bytes of RGBA


def attack(name: str, model: nn.Module, observed: list[list[np.ndarray]], real: torch.Tensor,
           y: torch.Tensor, data: Data, seed: int, settings: dict) -> tuple[torch.Tensor, float]:
    """Each target's reconstructions, matched to its real images (T, B, 1, 28, 28) in [0, 1],
    and the share of labels iDLG read right (nan where the attack needs none)."""
    if name == "mlp":
        return torch.stack([closest(data.pixels(first_layer_candidates(model, u)), r)
                            for u, r in zip(observed, real)]), math.nan
    flat = torch.stack([torch.cat([torch.from_numpy(a).flatten() for a in u]) for u in observed])
    if y.shape[1] == 1:
        labels = torch.tensor([[idlg_label(model, u)] for u in observed])
    else:  # iDLG reads one label only: give the attacker the batch's labels
        labels = y
    dummies = invert(model, flat, labels, tuple(real.shape[1:]), data.box, seed=seed,
                     **settings)
    recon = data.pixels(dummies.flatten(0, 1)).view_as(real)
    recon = torch.stack([r[match(r, t)] for r, t in zip(recon, real)])
    return recon, (labels == y).float().mean().item()


def run_setting(name: str, model: nn.Module, data: Data, images: int, batch: int | None,
                seed: int, views: list[str], count: int, settings: dict, out: Path | None):
    """One (model, setting, seed): its clients' real updates, then every view attacked.
    Returns a row per view; writes PNGs of its first images to ``out``."""
    targets = math.ceil(count / images)
    draw = np.random.default_rng(seed).choice(data.pool, (targets + CLIENTS - 1) * images,
                                              replace=False).reshape(-1, images)
    updates = [client_update(model, data.x[i], data.y[i], batch, seed) for i in draw]
    norms = [clip_update(u, CLIP)[1] for u in updates[:targets]]
    real = data.pixels(data.x[draw[:targets]])  # (T, B, 1, 28, 28)
    y = data.y[draw[:targets]]
    images_of = real.flatten(0, 1)
    floor = data.mean_image().expand_as(images_of)
    noise = np.random.default_rng()  # OS entropy, as driftfl's own noise
    rows = []
    for view in views:
        started = time.perf_counter()
        observed = [observe(view, u, updates[targets:], noise) for u in updates[:targets]]
        recon, labels = attack(name, model, observed, real, y, data, seed, settings)
        recon = recon.flatten(0, 1)
        p, s = psnr(recon, images_of), ssim(recon, images_of)
        seconds = time.perf_counter() - started
        rows.append({"model": name, "images": images,
                     "batch": batch or local_defaults()["batch_size"], "view": view,
                     "seed": seed, "psnr": p.tolist(), "ssim": s.tolist(), "labels": labels,
                     "norms": norms, "seconds": seconds,
                     "floor_psnr": psnr(floor, images_of).mean().item(),
                     "floor_ssim": ssim(floor, images_of).mean().item()})
        label_text = "" if math.isnan(labels) else f", labels {labels:.0%} right"
        print(f"  {name} B={images} seed {seed} {view}: PSNR {p.mean():.1f} dB, SSIM "
              f"{s.mean():.3f}{label_text} ({seconds:.0f} s)", flush=True)
        if out is not None:
            save_png(images_of[:SHOWN], recon[:SHOWN],
                     out / f"{tag(name, images, batch)}-{view}.png",
                     f"{name}, B={images}, {view}, seed {seed}")
    return rows


def tag(name: str, images: int, batch: int | None) -> str:
    return f"{name}-b{images}" + (f"-batch{batch}" if batch else "")


def table(rows: list[dict]) -> list[dict]:
    """Per (model, setting, view), in the order run: the mean over seeds of each seed's mean
    PSNR and SSIM, the seeds' spread, and over all target images the median PSNR and the
    share above 20 dB; the target clients' update norms before DP (median, share over C)."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        key = row["model"], row["images"], row["batch"], row["view"]
        groups.setdefault(key, []).append(row)
    out = []
    for (name, images, batch, view), runs in groups.items():
        per_seed = [np.mean(r["psnr"]) for r in runs]
        scores = np.concatenate([r["psnr"] for r in runs])
        norms = np.concatenate([r["norms"] for r in runs])  # the targets' updates before DP
        out.append({
            "model": name, "images": images, "batch": batch,
            "steps": math.ceil(images / batch), "view": view,
            "noise_std": noise_std(view),
            "attack": "first layer" if name == "mlp" else "inverting gradients",
            "seeds": len(runs), "targets": len(scores),
            "update_norm": float(np.median(norms)), "clipped": float(np.mean(norms > CLIP)),
            "psnr": float(np.mean(per_seed)), "psnr_sd": float(np.std(per_seed)),
            "psnr_median": float(np.median(scores)),
            "ssim": float(np.mean([np.mean(r["ssim"]) for r in runs])),
            "above_20db": float(np.mean(scores > 20)),
            "labels_right": float(np.mean([r["labels"] for r in runs])),
            "floor_psnr": float(np.mean([r["floor_psnr"] for r in runs])),
            "floor_ssim": float(np.mean([r["floor_ssim"] for r in runs])),
            "seconds": float(sum(r["seconds"] for r in runs))})
    return out


def print_table(summary: list[dict]) -> None:
    print("| model | B | batch | steps | view | noise std | update norm | clipped | PSNR (dB) "
          "| median | SSIM | > 20 dB | labels | floor PSNR | floor SSIM | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in summary:
        labels = "-" if math.isnan(r["labels_right"]) else f"{r['labels_right']:.0%}"
        print(f"| {r['model']} | {r['images']} | {r['batch']} | {r['steps']} | {r['view']} "
              f"| {r['noise_std']:.3g} | {r['update_norm']:.3g} | {r['clipped']:.0%} "
              f"| {r['psnr']:.1f} ± "
              f"{r['psnr_sd']:.1f} | {r['psnr_median']:.1f} | {r['ssim']:.3f} "
              f"| {r['above_20db']:.0%} | {labels} "
              f"| {r['floor_psnr']:.1f} | {r['floor_ssim']:.3f} | {r['seconds']:.0f} |")


def write_csv(summary: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(summary[0]))
        writer.writeheader()
        for row in summary:
            writer.writerow({k: f"{v:.4g}" if isinstance(v, float) else v
                             for k, v in row.items()})


def attack_settings(iterations: str, tv: str, restarts: int) -> dict[str, dict]:
    """ATTACK with the command line's overrides: a number for every conv net, or name=value."""
    settings = {name: dict(values, restarts=restarts) for name, values in ATTACK.items()}
    for key, text in (("iterations", iterations), ("tv_weight", tv)):
        for part in filter(None, text.split(",")):
            name, _, value = part.rpartition("=")
            for target in [name] if name else list(settings):
                settings[target][key] = type(ATTACK["cnn"][key])(value)
    return settings


def defaults(key: str) -> str:
    return ",".join(f"{name}={values[key]}" for name, values in ATTACK.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/driftfl-inversion"),
                        help="the CSV and PNGs go here (default %(default)s)")
    parser.add_argument("--checkpoints", type=Path, default=None,
                        help="the trained victims are cached here (default OUT/checkpoints)")
    parser.add_argument("--models", default="mlp,lenet5,cnn")
    parser.add_argument("--views", default=",".join(VIEWS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--images", type=int, default=32,
                        help="target images per (model, setting, view, seed)")
    parser.add_argument("--iterations", default="", help="the optimisation attack's: N for "
                        f"every conv net, or lenet5=N,cnn=N (default {defaults('iterations')})")
    parser.add_argument("--tv", default="",
                        help=f"its TV weight, the same way (default {defaults('tv_weight')})")
    parser.add_argument("--restarts", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = attack_settings(args.iterations, args.tv, args.restarts)
    views = args.views.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    data = Data()
    started = time.perf_counter()
    rows = []
    for name in args.models.split(","):
        model = trained_model(name, data, args.checkpoints or args.out / "checkpoints")
        for images, batch in SETTINGS[name]:
            for seed in seeds:
                print(f"{name} B={images} batch {batch or local_defaults()['batch_size']}, "
                      f"seed {seed}", flush=True)
                rows += run_setting(name, model, data, images, batch, seed, views, args.images,
                                    settings.get(name, {}), args.out if seed == seeds[0] else None)
    summary = table(rows)
    write_csv(summary, args.out / "inversion.csv")
    print(f"\n{time.perf_counter() - started:.0f} s; attack settings {settings}; CSV and PNGs "
          f"in {args.out}")
    print_table(summary)


if __name__ == "__main__":
    main()
