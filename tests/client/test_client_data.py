"""What a node trains on: its partition, or its own folder or .npz, read like the federation's.
(What a deployment node refuses to read is in test_node_boundary.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from driftfl.client.data import local_data as _local_data
from driftfl.client.node import node_config
from driftfl.common.config import compose
from driftfl.common.datasets import load_dataset
from driftfl.common.errors import ConfigError
from driftfl.common.partition import partition
from driftfl.common.protocol import DatasetMeta

META = DatasetMeta(classes=["cat", "dog", "eel"], shape=[1, 8, 8], mean=[0.5], std=[0.25])


def local_data(experiment, meta, config: dict, simulation: bool = False):
    return _local_data(experiment, meta, node_config(config), simulation=simulation)


@pytest.mark.parametrize("simulation, node", [
    (True, {"partition-id": 2, "num-partitions": 3}),  # a simulated node: the experiment's data
    (False, {"dataset": "fmnist", "partition-id": 2, "num-partitions": 3})])  # operator-named
def test_a_node_gets_exactly_its_partition(fmnist_available, simulation, node):
    cfg = compose(["dataset.subset=3000", "num_clients=3"])
    data = load_dataset(cfg.dataset)
    meta = DatasetMeta(list(data.classes), list(data.shape), list(data.mean), list(data.std))
    mine = local_data(cfg, meta, node, simulation)
    expected = partition(data.train_y, cfg.partition, 3, int(cfg.seed))[2]
    assert mine.partition_id == 2 and len(mine) == len(expected)
    assert mine.y.tolist() == data.train_y[expected].tolist()
    assert abs(float(mine.x.mean())) < 0.5  # normalised, not raw 0..255


def test_node_config_must_name_its_data():
    with pytest.raises(ConfigError, match="lacks partition-id and num-partitions"):
        local_data(compose([]), META, {}, simulation=True)
    for deployed in ({}, {"partition-id": 0, "num-partitions": 2}):  # the second: the old way
        with pytest.raises(ConfigError, match="names no data of its own: add data-dir="):
            local_data(compose([]), META, deployed)


def test_own_npz_is_read_with_the_federations_normalisation(tmp_path):
    x = np.full((4, 8, 8), 255, np.uint8)
    np.savez(tmp_path / "mine.npz", x=x, y=np.array([0, 1, 2, 1]))
    mine = local_data(None, META, {"data-dir": str(tmp_path / "mine.npz")})
    assert mine.partition_id == -1 and mine.y.tolist() == [0, 1, 2, 1]
    assert np.allclose(mine.x.numpy(), (1.0 - 0.5) / 0.25)


def test_own_image_folder_maps_class_names_to_the_federations_indices(tmp_path):
    for name, value in (("eel", 0), ("cat", 255)):  # a node without 'dog'
        (tmp_path / name).mkdir()
        Image.fromarray(np.full((16, 16), value, np.uint8), "L").save(tmp_path / name / "a.png")
    mine = local_data(None, META, {"data-dir": str(tmp_path)})
    assert sorted(mine.y.tolist()) == [0, 2]  # cat -> 0, eel -> 2, not 0 and 1
    assert tuple(mine.x.shape) == (2, 1, 8, 8)  # resized to the federation's images


def test_own_data_that_does_not_fit_is_refused(tmp_path):
    np.savez(tmp_path / "big.npz", x=np.zeros((2, 9, 9), np.uint8), y=np.zeros(2))
    with pytest.raises(ConfigError, match=r"shape \[1, 9, 9\].*trains on \[1, 8, 8\]"):
        local_data(None, META, {"data-dir": str(tmp_path / "big.npz")})
    np.savez(tmp_path / "labels.npz", x=np.zeros((2, 8, 8), np.uint8), y=np.array([0, 7]))
    with pytest.raises(ConfigError, match=r"labels outside 0..2"):
        local_data(None, META, {"data-dir": str(tmp_path / "labels.npz")})
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    with pytest.raises(ConfigError, match="no images found"):
        local_data(None, META, {"data-dir": str(tmp_path / "empty")})
