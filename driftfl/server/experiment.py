"""An experiment checked end to end before any training: settings, data, partition, model."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from driftfl.common.client_split import check_splittable, held_out_split
from driftfl.common.config import ExperimentConfig
from driftfl.common.datasets import ImageData, load_dataset, to_tensors
from driftfl.common.errors import ConfigError
from driftfl.common.models import DriftModel, build_model
from driftfl.common.partition import aux_indices, check_partition, label_histogram, partition
from driftfl.common.protocol import DatasetMeta
from driftfl.methods import check_experiment
from driftfl.strategies.parts.aux_set import AuxSet


@dataclass(frozen=True)
class Experiment:
    cfg: ExperimentConfig
    data: ImageData

    @property
    def aux_per_class(self) -> int:
        """Training samples per class the server keeps as its aux set (0: none)."""
        return self.cfg.strategy.aux_set_per_class()

    @cached_property
    def aux_indices(self) -> np.ndarray:
        """Indices of the server's aux set in the training data (empty without one)."""
        if not self.aux_per_class:
            return np.zeros(0, dtype=np.int64)
        return aux_indices(self.data.train_y, self.aux_per_class, self.cfg.seed)

    @property
    def meta(self) -> DatasetMeta:
        d = self.data
        return DatasetMeta(list(d.classes), list(d.shape), list(d.mean), list(d.std),
                           self.aux_per_class)

    def initial_model(self) -> DriftModel:
        """The round-0 global model, the same for the same seed."""
        torch.manual_seed(self.cfg.seed)
        return build_model(self.cfg.model, self.data.shape, self.data.num_classes)

    def partitions(self) -> list[np.ndarray]:
        """Every client's indices into the training data, by partition id."""
        return partition(self.data.train_y, self.cfg.partition, self.cfg.num_clients,
                         self.cfg.seed, self.aux_indices)

    def partition_histograms(self) -> list[list[int]]:
        """Every client's label histogram of what it trains on, by partition id, from the
        partitioning itself (less the held-out split, client_test_fraction)."""
        d, cfg = self.data, self.cfg
        histograms = []
        for i, p in enumerate(self.partitions()):
            train, _ = held_out_split(d.train_y[p], cfg.client_test_fraction, cfg.seed, i)
            histograms.append(label_histogram(d.train_y[p][train], d.num_classes))
        return histograms

    def aux_set(self, model: DriftModel) -> AuxSet | None:
        if not self.aux_per_class:
            return None
        d, held = self.data, self.aux_indices
        x, y = to_tensors(d.train_x[held], d.train_y[held], d.mean, d.std)
        return AuxSet(x.to(self.cfg.device), y.to(self.cfg.device), model.to(self.cfg.device),
                      d.num_classes)


def prepare_experiment(cfg: ExperimentConfig | dict, *,
                       make_partition: bool = False) -> Experiment:
    """Check everything that can be checked here; raise ConfigError on the first problem.

    Settings whose default follows the data (FedSSD's lam) are filled in. With
    ``make_partition`` the client partition is computed too (and cached on disk), so that an
    impossible split fails now and simulated clients find their indices ready.
    """
    cfg = check_experiment(cfg)
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but PyTorch sees no CUDA GPU here; use device=cpu")
    data = load_dataset(cfg.dataset)
    cfg = cfg.model_copy(update={"strategy": cfg.strategy.for_classes(data.num_classes)})
    experiment = Experiment(cfg, data)
    pool = len(data.train_y) - len(experiment.aux_indices)
    check_partition(cfg.partition, cfg.num_clients, data.num_classes, pool)
    experiment.initial_model()  # a model that cannot take these images fails here
    if make_partition or cfg.client_test_fraction > 0:  # a client too small to split: now
        for i, p in enumerate(experiment.partitions()):
            check_splittable(len(p), cfg.client_test_fraction, f"partition {i}")
    return experiment
