"""Differentiable Siamese Augmentation (DSA; Zhao & Bilen, ICML 2021).

Dataset condensation matches real and synthetic batches; augmenting both with the *same* random
transform (hence "siamese") lets the synthetic images learn from augmented real data, and every
op being differentiable lets the matching gradient flow back to the synthetic pixels.

As in the authors' default single mode, each call draws one transform family and then its
parameters, all from a ``torch.Generator`` seeded with the call's ``seed``, so the global RNG is
never touched and equal seeds give equal transforms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .errors import ConfigError

DSA_TRANSFORMS = ("color", "crop", "cutout", "flip", "scale", "rotate")
DEFAULT_TRANSFORMS = "color_crop_cutout_flip_scale_rotate"


def parse_transforms(text: str) -> tuple[str, ...]:
    """``"color_crop"`` -> ``("color", "crop")``; a ConfigError names an unknown or empty part."""
    names = tuple(text.split("_"))
    for name in names:
        if name not in DSA_TRANSFORMS:
            raise ConfigError(f"unknown DSA transform '{name}' in '{text}'; "
                              f"valid: {', '.join(DSA_TRANSFORMS)}")
    return names


@dataclass(frozen=True)
class DSAParams:
    """Strengths of the transforms; the defaults are the authors' (``ParamDiffAug``)."""

    scale: float = 1.2        # each axis scaled by a factor in [1/scale, scale]
    rotate: float = 15.0      # degrees, either way
    crop: float = 0.125       # translation of up to this fraction of the side (zero padding)
    cutout: float = 0.5       # side of the zeroed square, as a fraction of the image side
    brightness: float = 1.0   # added offset in [-brightness/2, brightness/2]
    saturation: float = 2.0   # distance from the grey image scaled by [0, saturation]
    contrast: float = 0.5     # distance from the image mean scaled by [contrast, contrast + 1]
    flip: float = 0.5         # probability of a horizontal flip


class SiameseAugment:
    """``aug(x, seed)``: one randomly chosen transform family, parameters drawn from ``seed``."""

    def __init__(self, transforms: tuple[str, ...], params: DSAParams = DSAParams()):
        if not transforms:
            raise ConfigError(f"no DSA transforms given; valid: {', '.join(DSA_TRANSFORMS)}")
        parse_transforms("_".join(transforms))  # validates the names
        self.transforms = tuple(transforms)
        self.params = params

    def __call__(self, x: Tensor, seed: int, *, per_sample: bool = False) -> Tensor:
        """Augment (N, C, H, W) images. ``per_sample=False``: one parameter set for the whole
        batch, so batches of any size get the very same transform; ``True``: one per image."""
        if x.shape[0] == 0:
            return x
        gen = torch.Generator().manual_seed(int(seed))
        family = self.transforms[int(torch.randint(len(self.transforms), (1,), generator=gen))]
        draws = x.shape[0] if per_sample else 1  # values below broadcast over the batch

        def uniform(low: float, high: float) -> Tensor:
            """``(draws,)`` values in [low, high), drawn on the CPU generator (so they do not
            depend on x's device) and then moved to x's device and dtype."""
            u = torch.rand(draws, generator=gen, dtype=torch.float64) * (high - low) + low
            return u.to(device=x.device, dtype=x.dtype)

        def integers(low: int, high: int) -> Tensor:  # in [low, high]
            return torch.randint(low, high + 1, (draws,), generator=gen).to(x.device)

        p = self.params
        if family == "color":  # brightness, saturation, contrast in turn, as the authors do
            x = x + (uniform(0.0, 1.0).view(-1, 1, 1, 1) - 0.5) * p.brightness
            grey = x.mean(dim=1, keepdim=True)  # equals x for one channel: saturation is a no-op
            x = (x - grey) * uniform(0.0, p.saturation).view(-1, 1, 1, 1) + grey
            mean = x.mean(dim=(1, 2, 3), keepdim=True)
            return (x - mean) * uniform(p.contrast, p.contrast + 1.0).view(-1, 1, 1, 1) + mean
        if family == "crop":
            return _translate(x, *(integers(-s, s) for s in _shifts(x, p.crop)))
        if family == "cutout":
            (sh, sw), (h, w) = _shifts(x, p.cutout), x.shape[2:]
            return _cutout(x, p.cutout, integers(0, h - sh % 2), integers(0, w - sw % 2))
        if family == "flip":
            return torch.where((uniform(0.0, 1.0) < p.flip).view(-1, 1, 1, 1), x.flip(3), x)
        if family == "scale":
            sx, sy = uniform(1.0 / p.scale, p.scale), uniform(1.0 / p.scale, p.scale)
            zero = torch.zeros_like(sx)
            return _warp(x, torch.stack([sx, zero, zero, zero, sy, zero], 1))
        angle = uniform(-p.rotate, p.rotate) * (math.pi / 180.0)  # rotate
        cos, sin, zero = angle.cos(), angle.sin(), torch.zeros_like(angle)
        return _warp(x, torch.stack([cos, -sin, zero, sin, cos, zero], 1))


def _warp(x: Tensor, theta: Tensor) -> Tensor:
    """Resample x through the affine maps ``theta`` (one row of 6, or one per image; output ->
    input coordinates) with zero padding. A shared map builds its grid once for the batch."""
    n, c, h, w = x.shape
    grid = F.affine_grid(theta.view(-1, 2, 3), [len(theta), c, h, w], align_corners=False)
    return F.grid_sample(x, grid.expand(n, -1, -1, -1), mode="bilinear", padding_mode="zeros",
                         align_corners=False)


def _shifts(x: Tensor, ratio: float) -> tuple[int, int]:
    return int(x.shape[2] * ratio + 0.5), int(x.shape[3] * ratio + 0.5)


def _translate(x: Tensor, dy: Tensor, dx: Tensor) -> Tensor:
    """Shift images by whole pixels (dy, dx), filling with zeros: the authors' pad-and-crop, as
    slicing or indexing of a zero-padded copy, which is exact and differentiable."""
    n, _, h, w = x.shape
    ph, pw = int(dy.abs().max()), int(dx.abs().max())
    padded = F.pad(x, (pw, pw, ph, ph))
    if len(dy) == 1:  # one shift for the whole batch
        top, left = ph - int(dy), pw - int(dx)
        return padded[:, :, top:top + h, left:left + w]
    rows = torch.arange(h, device=x.device) + ph - dy.view(n, 1)  # (N, H)
    cols = torch.arange(w, device=x.device) + pw - dx.view(n, 1)  # (N, W)
    batch = torch.arange(n, device=x.device).view(n, 1, 1)
    out = padded[batch, :, rows.view(n, h, 1), cols.view(n, 1, w)]  # (N, H, W, C)
    return out.permute(0, 3, 1, 2)


def _cutout(x: Tensor, ratio: float, cy: Tensor, cx: Tensor) -> Tensor:
    """Zero a square of side ``ratio`` * side centred at (cy, cx), clipped at the borders; a
    multiplicative mask so gradients still reach the pixels that are kept."""
    _, _, h, w = x.shape
    sh, sw = _shifts(x, ratio)
    top, left = (cy - sh // 2).view(-1, 1), (cx - sw // 2).view(-1, 1)
    r = torch.arange(h, device=x.device).view(1, h)
    c = torch.arange(w, device=x.device).view(1, w)
    in_rows = (r >= top) & (r < top + sh)    # (draws, H)
    in_cols = (c >= left) & (c < left + sw)  # (draws, W)
    keep = ~(in_rows.view(-1, 1, h, 1) & in_cols.view(-1, 1, 1, w))
    return x * keep.to(x.dtype)
