"""The data a node trains on: its partition of a named dataset, or its own folder.

In simulation every node is told ``partition-id`` and ``num-partitions``; in deployment a
SuperNode's ``--node-config`` says the same, or names its own data with ``data-dir`` (an
ImageFolder-style folder or an .npz file) so that it reads nothing but its own files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from driftfl.common import loaders
from driftfl.common.config import ExperimentConfig
from driftfl.common.datasets import DatasetSettings, load_dataset, to_tensors
from driftfl.common.errors import ConfigError
from driftfl.common.partition import PartitionSettings, aux_indices, partition
from driftfl.common.protocol import DatasetMeta


@dataclass(frozen=True)
class LocalData:
    x: torch.Tensor  # normalised float32 (N, C, H, W)
    y: torch.Tensor  # int64 (N,)
    partition_id: int  # -1 for a node with its own folder
    source: str

    def __len__(self) -> int:
        return len(self.y)


def local_data(experiment: ExperimentConfig | None, meta: DatasetMeta,
               node_config: Mapping) -> LocalData:
    """This node's training data (cached per process: a Ray actor serves many nodes)."""
    if node_config.get("data-dir"):
        return _own_data(str(node_config["data-dir"]), meta.to_json())
    for key in ("partition-id", "num-partitions"):
        if key not in node_config:
            raise ConfigError(f"node config lacks '{key}': start the SuperNode with --node-config "
                              "\"partition-id=<i> num-partitions=<n>\" or \"data-dir=<folder>\"")
    return _partition_data(experiment.dataset, experiment.partition, experiment.seed,
                           meta.to_json(), int(node_config["partition-id"]),
                           int(node_config["num-partitions"]))


@lru_cache(maxsize=16)
def _partition_data(dataset: DatasetSettings, spec: PartitionSettings, seed: int, meta_json: str,
                    partition_id: int, num_partitions: int) -> LocalData:
    meta = DatasetMeta.from_json(meta_json)
    if not 0 <= partition_id < num_partitions:
        raise ConfigError(f"partition-id {partition_id} is outside 0..{num_partitions - 1}")
    data = load_dataset(dataset)
    aux = aux_indices(data.train_y, meta.aux_per_class, seed) if meta.aux_per_class else None
    mine = partition(data.train_y, spec, num_partitions, seed, aux)[partition_id]
    x, y = to_tensors(data.train_x[mine], data.train_y[mine], meta.mean, meta.std)
    return LocalData(x, y, partition_id,
                     f"{dataset.name} partition {partition_id}/{num_partitions}")


@lru_cache(maxsize=4)
def _own_data(path: str, meta_json: str) -> LocalData:
    meta = DatasetMeta.from_json(meta_json)
    channels, height, _ = meta.shape
    source = Path(path).expanduser()
    if source.suffix == ".npz":
        x, y, _, _ = loaders.read_npz(source)
        if list(x.shape[1:]) != list(meta.shape):
            raise ConfigError(f"{source} holds images of shape {list(x.shape[1:])}, "
                              f"but this federation trains on {list(meta.shape)}")
    else:
        folder = source / "train" if (source / "train").is_dir() else source
        x, y, _ = loaders.read_image_folder(folder, list(meta.classes), height, channels)
    if len(y) and not (0 <= y.min() and y.max() < len(meta.classes)):
        raise ConfigError(f"{source} has labels outside 0..{len(meta.classes) - 1}")
    tx, ty = to_tensors(x, np.asarray(y), meta.mean, meta.std)
    return LocalData(tx, ty, -1, str(source))
