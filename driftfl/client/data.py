"""The data a node trains on: its partition of a named dataset, or its own folder or .npz.

In simulation every node is told ``partition-id`` and ``num-partitions`` and reads its share of
the experiment's dataset. In deployment the operator's ``--node-config`` names the data, and
only it: ``data-dir`` (an ImageFolder-style folder or an .npz file), or ``dataset`` with
``partition-id`` and ``num-partitions`` (and ``dataset-root``, ``dataset-download``). The
server's dataset section then only has to agree on the name; its root and download are ignored.
With ``client_test_fraction`` a held-out split of whatever the node reads is kept apart
(driftfl.common.client_split): the node trains on the rest, and reports only the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from driftfl.common import loaders
from driftfl.common.client_split import held_out_split
from driftfl.common.config import ExperimentConfig
from driftfl.common.datasets import DatasetSettings, dataset_settings, load_dataset, to_tensors
from driftfl.common.errors import ConfigError
from driftfl.common.partition import PartitionSettings, aux_indices, client_partition
from driftfl.common.protocol import DatasetMeta

from .node import NO_DATA_NAMED, NodeConfig


@dataclass(frozen=True)
class LocalData:
    x: torch.Tensor  # normalised float32 (N, C, H, W): what the node trains on
    y: torch.Tensor  # int64 (N,)
    partition_id: int  # -1 for a node with its own folder
    source: str
    test_x: torch.Tensor | None = None  # the held-out split (client_test_fraction > 0)
    test_y: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.y)


def split_local(x: torch.Tensor, y: torch.Tensor, partition_id: int, source: str,
                fraction: float, seed: int) -> LocalData:
    """The node's data with ``fraction`` of it held out for testing (none when 0)."""
    if fraction <= 0:
        return LocalData(x, y, partition_id, source)
    train, test = held_out_split(y.numpy(), fraction, seed, partition_id)
    train, test = torch.from_numpy(train), torch.from_numpy(test)
    return LocalData(x[train], y[train], partition_id, source, x[test], y[test])


def local_data(experiment: ExperimentConfig | None, meta: DatasetMeta, node: NodeConfig, *,
               simulation: bool) -> LocalData:
    """This node's training data (cached per process: a Ray actor serves many nodes)."""
    fraction = experiment.client_test_fraction if experiment else 0.0
    seed = experiment.seed if experiment else 0
    if node.data_dir:
        return _own_data(node.data_dir, meta.to_json(), fraction, seed)
    if node.dataset:
        dataset = operator_dataset(experiment.dataset, node)
    elif simulation and node.partition_id is not None:
        dataset = experiment.dataset
    elif simulation:
        raise ConfigError("node config lacks partition-id and num-partitions, which every "
                          "simulated node gets")
    else:
        raise ConfigError(NO_DATA_NAMED)
    try:
        return _partition_data(dataset, experiment.partition, experiment.seed, meta.to_json(),
                               node.partition_id, node.num_partitions, fraction)
    except ConfigError as err:
        if not node.dataset:
            raise
        raise ConfigError(_in_node_terms(str(err))) from None


def _in_node_terms(message: str) -> str:
    """A dataset's advice, with the experiment's settings named as this node's keys."""
    for setting, key in (("dataset.download=true", "dataset-download=true in --node-config"),
                         ("dataset.root", "dataset-root in --node-config")):
        message = message.replace(setting, key)
    return message


def operator_dataset(requested: DatasetSettings, node: NodeConfig) -> DatasetSettings:
    """The server's dataset section with its place and download replaced by the operator's;
    a different dataset than the node holds is refused. Its other settings (subset, EMNIST's
    split, ...) only select from the data the operator named, so they are kept."""
    if requested.name != node.dataset:
        raise ConfigError(f"the server asks for dataset '{requested.name}', but this node "
                          f"holds '{node.dataset}' (its --node-config dataset)")
    return dataset_settings({**requested.model_dump(), "root": node.dataset_root,
                             "download": node.dataset_download})


@lru_cache(maxsize=16)
def _partition_data(dataset: DatasetSettings, spec: PartitionSettings, seed: int, meta_json: str,
                    partition_id: int, num_partitions: int, fraction: float = 0.0) -> LocalData:
    meta = DatasetMeta.from_json(meta_json)
    data = load_dataset(dataset)
    aux = aux_indices(data.train_y, meta.aux_per_class, seed) if meta.aux_per_class else None
    mine = client_partition(data.train_y, spec, num_partitions, seed, aux, partition_id)
    x, y = to_tensors(data.train_x[mine], data.train_y[mine], meta.mean, meta.std)
    return split_local(x, y, partition_id,
                       f"{dataset.name} partition {partition_id}/{num_partitions}", fraction, seed)


@lru_cache(maxsize=4)
def _own_data(path: str, meta_json: str, fraction: float = 0.0, seed: int = 0) -> LocalData:
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
    return split_local(tx, ty, -1, str(source), fraction, seed)
