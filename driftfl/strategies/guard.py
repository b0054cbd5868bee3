"""What one reply may do to the server's state, measured against its peers and the state itself.

The reply checks (``aggregation.check_reply``) bound each reply alone; a hostile client inside
those bounds can still send a payload many times larger than any honest client's. Two rules
close that, for the model update and for every payload that feeds strategy state (SCAFFOLD's
Delta c, FedCurv's Fisher, prototypes, DCFL's pre-trained model):

- **Peers.** A payload's norm may be at most ``max_peer_ratio`` times the round's *lower*
  median of the same payload's norms (the smaller middle value: with two replies, the smaller
  one), so while most replies are honest, one reply cannot outweigh them by size.
- **State.** A new state replaces the old only when it is finite and has moved by at most
  ``max_update_ratio`` times max(1, the old state's norm); otherwise the old state stays and the
  refusal is logged and recorded like a rejected reply (``RoundReport.refused_state``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np


def norm(arrays: Mapping[str, np.ndarray] | np.ndarray) -> float:
    """The L2 norm over the floating arrays (float64 sums; NaN where one is not finite)."""
    values = arrays.values() if isinstance(arrays, Mapping) else [arrays]
    return math.sqrt(sum(float(np.sum(np.square(v, dtype=np.float64)))
                         for v in values if np.asarray(v).dtype.kind == "f"))


def distance(new: Mapping[str, np.ndarray], old: Mapping[str, np.ndarray]) -> float:
    """||new - old||_2 over the floating arrays of ``new`` (float64)."""
    return math.sqrt(sum(float(np.sum(np.square(v.astype(np.float64) - old[k])))
                         for k, v in new.items() if v.dtype.kind == "f"))


def lower_median(values: Sequence[float]) -> float:
    """The smaller middle value of the finite ``values``: the median for an odd count, the
    lower of the two otherwise (NaN when none is finite)."""
    ordered = sorted(v for v in values if math.isfinite(v))
    return ordered[(len(ordered) - 1) // 2] if ordered else math.nan


def peer_outliers(norms: Sequence[float], ratio: float) -> tuple[list[int], float]:
    """(positions whose norm exceeds ``ratio`` x the lower median of ``norms``, that bound)."""
    if not norms:
        return [], math.inf
    bound = ratio * lower_median(norms)
    return [i for i, n in enumerate(norms) if not n <= bound], bound


def state_problem(new: Mapping[str, np.ndarray], old: Mapping[str, np.ndarray] | None,
                  ratio: float) -> str | None:
    """Why ``new`` must not replace ``old`` (None: it may): a value not finite, or a move of more
    than ``ratio`` x max(1, ||old||) (from zero when there is no old state yet)."""
    for key, value in new.items():
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return f"'{key}' would hold NaN or infinite values"
    base = old if old is not None else {k: np.zeros_like(v) for k, v in new.items()}
    moved, bound = distance(new, base), ratio * max(1.0, norm(base))
    if not moved <= bound:
        return f"it would move by {moved:.3g}, over the bound {bound:.3g} (max_update_ratio)"
    return None
