"""An experiment checked end to end before any training: names, numbers, data, model."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from omegaconf import DictConfig

from driftfl.common.config import check_settings
from driftfl.common.datasets import ImageData, load_dataset, to_tensors
from driftfl.common.models import DriftModel, build_model
from driftfl.common.partition import check_partition, holdout_indices, partition
from driftfl.common.protocol import DatasetMeta
from driftfl.strategies import check_strategy, server_holdout
from driftfl.strategies.auxiliary import AuxiliarySet


@dataclass(frozen=True)
class Experiment:
    cfg: DictConfig
    data: ImageData
    holdout_per_class: int = 0  # training samples per class the server keeps

    @cached_property
    def holdout(self) -> np.ndarray:
        """Indices of the server's auxiliary set in the training data (empty without one)."""
        if not self.holdout_per_class:
            return np.zeros(0, dtype=np.int64)
        return holdout_indices(self.data.train_y, self.holdout_per_class, int(self.cfg.seed))

    @property
    def meta(self) -> DatasetMeta:
        d = self.data
        return DatasetMeta(list(d.classes), list(d.shape), list(d.mean), list(d.std),
                           self.holdout_per_class)

    def initial_model(self) -> DriftModel:
        """The round-0 global model, the same for the same seed."""
        torch.manual_seed(int(self.cfg.seed))
        return build_model(self.cfg.model, self.data.shape, self.data.num_classes)

    def auxiliary_set(self, model: DriftModel) -> AuxiliarySet | None:
        if not self.holdout_per_class:
            return None
        d = self.data
        x, y = to_tensors(d.train_x[self.holdout], d.train_y[self.holdout], d.mean, d.std)
        return AuxiliarySet(x.to(self.cfg.device), y.to(self.cfg.device),
                            model.to(self.cfg.device), d.num_classes)


def prepare_experiment(cfg: DictConfig, *, make_partition: bool = False) -> Experiment:
    """Check everything that can be checked here; raise ConfigError on the first problem.

    With ``make_partition`` the client partition is computed too (and cached on disk), so that
    an impossible split fails now and simulated clients find their indices ready.
    """
    check_settings(cfg)
    check_strategy(cfg)
    data = load_dataset(cfg.dataset)
    experiment = Experiment(cfg, data, server_holdout(cfg))
    pool = len(data.train_y) - len(experiment.holdout)
    check_partition(cfg.partition, int(cfg.num_clients), data.num_classes, pool)
    experiment.initial_model()  # a model that cannot take these images fails here
    if make_partition:
        partition(data.train_y, cfg.partition, int(cfg.num_clients), int(cfg.seed),
                  experiment.holdout)
    return experiment
