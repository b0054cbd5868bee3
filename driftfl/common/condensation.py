"""The half of DCFL's settings its clients read: how they condense their data and how they
train on condensed images. The DCFL strategy's settings extend these (one ``strategy``
section, checked whole on the server); a client reads only these fields of it.

Defaults are CPU-friendly (DM with 200 iterations takes seconds per client with the MLP);
the DM/DC/DSA authors' paper-grade settings are in docs/algorithms.md (DCFL).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from flwr.app import ArrayRecord
from pydantic import Field, field_validator

from .augment import DEFAULT_TRANSFORMS, parse_transforms
from .errors import ConfigError
from .settings import MANY, Settings, validated


class CondensationSettings(Settings):
    condensation: Literal["dm", "dc", "dsa"] = "dm"  # distribution / gradient matching (+DSA)
    ipc: int = Field(10, ge=1, le=MANY)  # condensed images per class the client holds
    condense_iterations: int = Field(200, ge=1, le=MANY)  # paper-grade: DM 20,000, DC/DSA 1,000
    condense_lr: float = Field(1.0, gt=0)  # SGD on the pixels; the authors: DM 1.0, DC/DSA 0.1
    condense_batch: int = Field(256, ge=1, le=MANY)  # real images per class per iteration
    dc_outer_loop: int = Field(10, ge=1, le=MANY)  # dc/dsa: matching steps per iteration
    # dc/dsa: network steps on the synthetic set between matching steps
    dc_inner_loop: int = Field(50, ge=0, le=MANY)
    dc_net_lr: float = Field(0.01, gt=0)  # dc/dsa: that network's learning rate
    dsa: bool = True  # DSA on the local and the condensed training batches
    dsa_transforms: str = DEFAULT_TRANSFORMS  # DSA's transforms; digits: drop flip
    finetune_epochs: int = Field(1, ge=0, le=MANY)  # E_s: epochs on the received condensed images
    finetune_lr: float = Field(0.001, gt=0)  # eta_s (< lr, which is eta_c)
    finetune_batch_size: int = Field(32, ge=1, le=MANY)  # B_s
    condensed_use: Literal["finetune", "mix"] = "finetune"  # mix: one stage on local + received

    @field_validator("dsa_transforms")
    @classmethod
    def _known_transforms(cls, value: str) -> str:
        try:
            parse_transforms(value)
        except ConfigError as err:
            raise ValueError(str(err)) from None
        return value


def condensation_settings(section: Mapping[str, Any]) -> CondensationSettings:
    """These fields of an experiment's ``strategy`` section (the rest is the server's)."""
    fields = CondensationSettings.model_fields
    return validated(CondensationSettings, {k: v for k, v in section.items() if k in fields},
                     "strategy.")


PIXEL_BOUND = 1e4  # condensed pixels (normalised images) beyond this are not images


def read_condensed(record: ArrayRecord, shape: tuple[int, ...], num_classes: int,
                   ipc: int | None = None) -> tuple[np.ndarray, np.ndarray] | str:
    """(images, labels) of a ``condensed`` record, or why it cannot be used: the server checks
    a client's set with it, a client the images a server sent. ``ipc``: the most images of one
    class (a client's own set; a server's holds many clients')."""
    try:
        images, labels = record["images"].numpy(), record["labels"].numpy()
    except Exception as err:  # missing or unreadable arrays
        return f"condensed set cannot be read: {err!r}"
    n = len(labels) if labels.ndim == 1 else -1
    if (images.dtype != np.float32 or labels.dtype != np.int64 or n < 1
            or images.shape != (n, *shape)):
        expected = ", ".join(map(str, shape))
        return (f"condensed set is {images.dtype}{list(images.shape)} / "
                f"{labels.dtype}{list(labels.shape)}, expected float32 [N, {expected}] / int64 [N]")
    if not np.isfinite(images).all() or np.abs(images).max() > PIXEL_BOUND:
        return "condensed images hold NaN/inf or out-of-range values"
    if ((labels < 0) | (labels >= num_classes)).any():
        return f"condensed labels outside 0..{num_classes - 1}"
    per_class = np.bincount(labels, minlength=num_classes)
    if ipc is not None and per_class.max() > ipc:
        return (f"condensed set holds {per_class.max()} images of class "
                f"{per_class.argmax()}, more than ipc = {ipc}")
    return images, labels
