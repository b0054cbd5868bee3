"""What a node keeps between messages of a run: named sets of tensors in ``context.state``.

Flower hands every message of a run the node's Context; in deployment each message runs in a
fresh process, so state a method needs in a later round (SCAFFOLD's c_k, FedDyn's previous
gradient, MOON's previous local model, FedCSD's teacher logits) lives here, never in Python
globals. Values are stored as NumPy arrays in an ArrayRecord under the method's key.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context


def keep(context: Context, key: str, tensors: dict[str, torch.Tensor]) -> None:
    """Store ``tensors`` (by name) under ``key``, replacing what was there."""
    context.state[key] = ArrayRecord({name: Array(t.detach().cpu().numpy())
                                      for name, t in tensors.items()})


def recall(context: Context, key: str,
           device: torch.device | str = "cpu") -> dict[str, torch.Tensor] | None:
    """The tensors stored under ``key`` (None if this node has stored none yet)."""
    if key not in context.state.array_records:
        return None
    record = context.state.array_records[key]
    return {name: torch.from_numpy(np.array(record[name].numpy())).to(device)
            for name in record.keys()}
