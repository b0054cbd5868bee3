"""The names of the differentiable Siamese augmentation's transforms, importable without torch:
DCFL's settings check ``strategy.dsa_transforms`` against them before torch loads
(driftfl.common.augment applies them)."""

from __future__ import annotations

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
