"""A flwr-datasets Partitioner over label counts already known, so that flwr-datasets' own
plotting (``plot_label_distributions``) can draw a split it did not make: our covering or IID
split, or the counts deployed nodes reported in the data survey. Imported only to draw, as
``datasets`` is slow to import."""

from __future__ import annotations

import numpy as np
from datasets import ClassLabel, Dataset, Features
from flwr_datasets.partitioner import Partitioner

LABEL = "label"


class KnownCountsPartitioner(Partitioner):
    """Partition i is a labels-only table holding exactly ``histograms[i]`` (one count per
    class); its dataset's label column is a ClassLabel named by ``classes``."""

    def __init__(self, histograms: list[list[int]], classes: list[str]):
        super().__init__()
        counts = np.asarray(histograms, dtype=np.int64).reshape(len(histograms), len(classes))
        self._offsets = np.concatenate([[0], np.cumsum(counts.sum(axis=1))])
        labels = np.repeat(np.tile(np.arange(len(classes)), len(counts)), counts.ravel())
        self.dataset = Dataset.from_dict({LABEL: labels},
                                         features=Features({LABEL: ClassLabel(names=classes)}))

    @property
    def num_partitions(self) -> int:
        return len(self._offsets) - 1

    def load_partition(self, partition_id: int) -> Dataset:
        return self.dataset.select(range(self._offsets[partition_id],
                                         self._offsets[partition_id + 1]))
