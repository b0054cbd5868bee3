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
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

# declared torch-free there (DCFL's settings check them before torch loads); imported from here
from .dsa_transforms import DEFAULT_TRANSFORMS, DSA_TRANSFORMS, parse_transforms  # noqa: F401
from .errors import ConfigError


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
        family, params = self.draw(seed, x.shape, x.shape[0] if per_sample else 1)
        return self.apply(x, family, {k: v.to(x.device) for k, v in params.items()})

    def grouped(self, x: Tensor, sizes: Sequence[int], seeds: Sequence[int]) -> Tensor:
        """``x`` as consecutive groups of ``sizes`` images, group k augmented exactly as
        ``self(group_k, seeds[k])`` would (DM's classes: each draws its own transform, shared
        by its real and synthetic images), returned as one batch. Each group is a view of x
        and takes its transform's shared-parameter path (a shift is a slice, a warp one grid):
        measured, that is faster than one call with a parameter per image (per-image grids
        and gathers cost 2-5x more)."""
        if len(sizes) != len(seeds) or sum(sizes) != x.shape[0]:
            raise ValueError(f"{len(sizes)} groups of {sum(sizes)} images and {len(seeds)} "
                             f"seeds for a batch of {x.shape[0]}")
        return torch.cat([self(group, seed) for group, seed in zip(x.split(list(sizes)), seeds)])

    def draw(self, seed: int, shape: Sequence[int], draws: int) -> tuple[str, dict[str, Tensor]]:
        """The family and ``draws`` sets of its parameters (CPU float64 or int64 tensors) that
        ``seed`` gives for images of ``shape``: always the same, whatever the device."""
        gen = torch.Generator().manual_seed(int(seed))
        family = self.transforms[int(torch.randint(len(self.transforms), (1,), generator=gen))]

        def uniform(low: float, high: float) -> Tensor:
            return torch.rand(draws, generator=gen, dtype=torch.float64) * (high - low) + low

        def integers(low: int, high: int) -> Tensor:  # in [low, high]
            return torch.randint(low, high + 1, (draws,), generator=gen)

        p, (h, w) = self.params, tuple(shape[2:])
        if family == "color":  # brightness, saturation, contrast in turn, as the authors do
            return family, {"brightness": uniform(0.0, 1.0),
                            "saturation": uniform(0.0, p.saturation),
                            "contrast": uniform(p.contrast, p.contrast + 1.0)}
        if family == "crop":
            sh, sw = _shifts(h, w, p.crop)
            return family, {"dy": integers(-sh, sh), "dx": integers(-sw, sw)}
        if family == "cutout":
            sh, sw = _shifts(h, w, p.cutout)
            return family, {"cy": integers(0, h - sh % 2), "cx": integers(0, w - sw % 2)}
        if family == "flip":
            return family, {"flip": uniform(0.0, 1.0) < p.flip}
        if family == "scale":
            return family, {"sx": uniform(1.0 / p.scale, p.scale),
                            "sy": uniform(1.0 / p.scale, p.scale)}
        return family, {"angle": uniform(-p.rotate, p.rotate)}  # rotate, in degrees

    def apply(self, x: Tensor, family: str, params: dict[str, Tensor]) -> Tensor:
        """``family`` with ``params`` (each of one value, or one per image, on x's device)."""
        def value(name: str) -> Tensor:  # x's dtype, broadcast over (N, C, H, W)
            return params[name].to(x.dtype).view(-1, 1, 1, 1)

        p = self.params
        if family == "color":
            shift, contrast = (value("brightness") - 0.5) * p.brightness, value("contrast")
            if x.shape[1] > 1:  # grey is x itself for one channel: saturation changes nothing
                x = x + shift
                grey = x.mean(dim=1, keepdim=True)
                x = (x - grey) * value("saturation") + grey
                shift = 0.0
            # contrast around each image's mean m (after the shift): (x + s - m) c + m,
            # computed as c x + (c s + (1 - c) m) in one pass over the pixels
            mean = x.mean(dim=(1, 2, 3), keepdim=True) + shift
            return torch.addcmul(contrast * shift + (1 - contrast) * mean, x, contrast)
        if family == "crop":
            return _translate(x, params["dy"], params["dx"])
        if family == "cutout":
            return _cutout(x, p.cutout, params["cy"], params["cx"])
        if family == "flip":
            flip = params["flip"]
            if len(flip) == 1:  # one coin for the batch
                return x.flip(3) if bool(flip) else x
            return torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
        if family == "scale":
            sx, sy = params["sx"].to(x.dtype), params["sy"].to(x.dtype)
            zero = torch.zeros_like(sx)
            return _warp(x, torch.stack([sx, zero, zero, zero, sy, zero], 1))
        angle = params["angle"].to(x.dtype) * (math.pi / 180.0)
        cos, sin, zero = angle.cos(), angle.sin(), torch.zeros_like(angle)
        return _warp(x, torch.stack([cos, -sin, zero, sin, cos, zero], 1))


def _warp(x: Tensor, theta: Tensor) -> Tensor:
    """Resample x through the affine maps ``theta`` (one row of 6, or one per image; output ->
    input coordinates) with zero padding. A shared map builds its grid once for the batch."""
    n, c, h, w = x.shape
    grid = F.affine_grid(theta.view(-1, 2, 3), [len(theta), c, h, w], align_corners=False)
    return F.grid_sample(x, grid.expand(n, -1, -1, -1), mode="bilinear", padding_mode="zeros",
                         align_corners=False)


def _shifts(h: int, w: int, ratio: float) -> tuple[int, int]:
    return int(h * ratio + 0.5), int(w * ratio + 0.5)


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
    sh, sw = _shifts(h, w, ratio)
    top, left = (cy - sh // 2).view(-1, 1), (cx - sw // 2).view(-1, 1)
    r = torch.arange(h, device=x.device).view(1, h)
    c = torch.arange(w, device=x.device).view(1, w)
    in_rows = (r >= top) & (r < top + sh)    # (draws, H)
    in_cols = (c >= left) & (c < left + sw)  # (draws, W)
    keep = ~(in_rows.view(-1, 1, h, 1) & in_cols.view(-1, 1, 1, w))
    return x * keep.to(x.dtype)
