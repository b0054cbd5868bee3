"""An experiment checked end to end before any training: names, numbers, data, model."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from driftfl.common.config import check_settings
from driftfl.common.datasets import ImageData, load_dataset
from driftfl.common.models import DriftModel, build_model
from driftfl.common.partition import check_partition, partition
from driftfl.common.protocol import DatasetMeta
from driftfl.strategies import check_strategy


@dataclass(frozen=True)
class Experiment:
    cfg: DictConfig
    data: ImageData

    @property
    def meta(self) -> DatasetMeta:
        d = self.data
        return DatasetMeta(list(d.classes), list(d.shape), list(d.mean), list(d.std))

    def initial_model(self) -> DriftModel:
        """The round-0 global model, the same for the same seed."""
        torch.manual_seed(int(self.cfg.seed))
        return build_model(self.cfg.model, self.data.shape, self.data.num_classes)


def prepare_experiment(cfg: DictConfig, *, make_partition: bool = False) -> Experiment:
    """Check everything that can be checked here; raise ConfigError on the first problem.

    With ``make_partition`` the client partition is computed too (and cached on disk), so that
    an impossible split fails now and simulated clients find their indices ready.
    """
    check_settings(cfg)
    check_strategy(cfg)
    data = load_dataset(cfg.dataset)
    check_partition(cfg.partition, int(cfg.num_clients), data.num_classes, len(data.train_y))
    experiment = Experiment(cfg, data)
    experiment.initial_model()  # a model that cannot take these images fails here
    if make_partition:
        partition(data.train_y, cfg.partition, int(cfg.num_clients), int(cfg.seed))
    return experiment
