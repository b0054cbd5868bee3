"""Split a dataset's training labels over clients with flwr-datasets partitioners.

Indices are cached on disk by (labels, partitioner and its parameters, client count, seed), so
a fresh client process finds its share in milliseconds instead of re-running the partitioner.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Mapping
from typing import Literal

import numpy as np
from pydantic import Field

from .errors import ConfigError
from .paths import cache_dir
from .settings import Settings, section


class PartitionSettings(Settings):
    """The ``partition`` section; IID takes nothing more."""

    name: str


class DirichletSettings(PartitionSettings):
    alpha: float = Field(0.5, gt=0)  # smaller is more skewed
    min_size: int = Field(10, ge=0)  # redraw until every client holds this many samples
    self_balancing: bool = False  # flwr-datasets' balancing of partition sizes


class PathologicalSettings(PartitionSettings):
    classes_per_client: int = 2  # 1..number of classes, checked against the dataset
    assignment: Literal["random", "deterministic", "first-deterministic"] = "random"


class ShardsSettings(PartitionSettings):
    shards_per_client: int = Field(2, ge=1)


PARTITIONS: dict[str, type[PartitionSettings]] = {
    "iid": PartitionSettings, "dirichlet": DirichletSettings,
    "pathological": PathologicalSettings, "shards": ShardsSettings}


def partition_settings(spec: Mapping | PartitionSettings) -> PartitionSettings:
    return section("partition", spec, PARTITIONS)


def check_partition(spec: Mapping | PartitionSettings, num_clients: int, num_classes: int,
                    num_samples: int) -> None:
    """Raise ConfigError for a partition that cannot be made of this data, before any work."""
    spec = partition_settings(spec)
    if num_clients > num_samples:
        raise ConfigError(f"num_clients={num_clients} is more than the {num_samples} training "
                          "samples; use fewer clients or a larger dataset.subset")
    if isinstance(spec, DirichletSettings) and spec.min_size * num_clients > num_samples:
        raise ConfigError(
            f"partition.min_size={spec.min_size} x {num_clients} clients exceeds the "
            f"{num_samples} training samples; lower partition.min_size")
    if isinstance(spec, PathologicalSettings) and not 1 <= spec.classes_per_client <= num_classes:
        raise ConfigError(f"partition.classes_per_client must be in 1..{num_classes}, "
                          f"got {spec.classes_per_client}")
    if isinstance(spec, ShardsSettings) and spec.shards_per_client * num_clients > num_samples:
        raise ConfigError(f"partition.shards_per_client={spec.shards_per_client} leaves some "
                          f"of the {num_clients * spec.shards_per_client} shards no sample")


def _partitioner(spec: PartitionSettings, num_clients: int, seed: int):
    from flwr_datasets import partitioner as fp

    if isinstance(spec, DirichletSettings):
        return fp.DirichletPartitioner(
            num_partitions=num_clients, partition_by="label", alpha=spec.alpha,
            min_partition_size=spec.min_size, self_balancing=spec.self_balancing, seed=seed)
    if isinstance(spec, PathologicalSettings):
        return fp.PathologicalPartitioner(
            num_partitions=num_clients, partition_by="label",
            num_classes_per_partition=spec.classes_per_client,
            class_assignment_mode=spec.assignment, seed=seed)
    if isinstance(spec, ShardsSettings):
        return fp.ShardPartitioner(num_partitions=num_clients, partition_by="label",
                                   num_shards_per_partition=spec.shards_per_client, seed=seed)
    return fp.IidPartitioner(num_partitions=num_clients)


def compute_partition(labels: np.ndarray, spec: Mapping | PartitionSettings, num_clients: int,
                      seed: int) -> list[np.ndarray]:
    """Indices into ``labels`` for each client (no cache)."""
    from datasets import Dataset

    spec = partition_settings(spec)
    table = Dataset.from_dict({"label": labels, "index": np.arange(len(labels))})
    if spec.name == "iid":  # IidPartitioner cuts contiguous shards: shuffle first
        table = table.shuffle(seed=seed)
    partitioner = _partitioner(spec, num_clients, seed)
    partitioner.dataset = table
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one warning per Dirichlet redraw
            return [np.asarray(partitioner.load_partition(i)["index"], dtype=np.int64)
                    for i in range(num_clients)]
    except ValueError as err:
        if isinstance(spec, DirichletSettings):
            raise ConfigError(
                f"Dirichlet(alpha={spec.alpha:g}) could not give each of {num_clients} clients "
                f"at least partition.min_size={spec.min_size} samples in 11 draws; raise "
                "partition.alpha, lower partition.min_size or use fewer clients") from err
        raise ConfigError(f"partition '{spec.name}' failed: {err}") from err


def aux_indices(labels: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """The server's aux set: ``per_class`` samples of every class, drawn by ``seed``, that the
    server keeps and no client ever receives; sorted indices into ``labels``."""
    rng = np.random.default_rng([seed, 7])  # a stream of its own, apart from the partitioner's
    chosen = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        if len(members) <= per_class:
            raise ConfigError(f"the server's aux set wants {per_class} samples of class {c}, "
                              f"which has only {len(members)}; lower strategy.aux_per_class")
        chosen.append(rng.choice(members, size=per_class, replace=False))
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


def _cache_key(labels: np.ndarray, spec: PartitionSettings, num_clients: int, seed: int,
               aux: np.ndarray) -> str:
    digest = hashlib.sha256(np.ascontiguousarray(labels).tobytes())
    digest.update(np.ascontiguousarray(aux, dtype=np.int64).tobytes())
    digest.update(json.dumps([spec.model_dump(), num_clients, seed], sort_keys=True).encode())
    return f"{spec.name}-{num_clients}-{digest.hexdigest()[:20]}"


def partition(labels: np.ndarray, spec: Mapping | PartitionSettings, num_clients: int, seed: int,
              aux: np.ndarray | None = None) -> list[np.ndarray]:
    """Indices into ``labels`` for each client, read from or written to the disk cache. Samples
    in ``aux`` (the server's aux set) are left out before partitioning."""
    spec = partition_settings(spec)
    aux = np.zeros(0, dtype=np.int64) if aux is None else np.asarray(aux)
    key = _cache_key(labels, spec, num_clients, seed, aux)
    path = cache_dir() / "partitions" / f"{key}.npz"
    if path.is_file():
        with np.load(path) as cached:
            return [cached[f"client{i}"] for i in range(num_clients)]
    pool = np.setdiff1d(np.arange(len(labels)), aux)
    parts = [pool[p] for p in compute_partition(labels[pool], spec, num_clients, seed)]
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename: clients starting together never read a half-written file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
    with os.fdopen(fd, "wb") as f:
        np.savez(f, **{f"client{i}": p for i, p in enumerate(parts)})
    os.replace(tmp, path)
    return parts


def label_histogram(labels: np.ndarray, num_classes: int) -> list[int]:
    return np.bincount(labels, minlength=num_classes).astype(int).tolist()


def describe(spec: PartitionSettings) -> str:
    """A short human name for a partition, e.g. 'Dirichlet(0.5)' or '#C=2'."""
    if isinstance(spec, DirichletSettings):
        return f"Dirichlet({spec.alpha})"
    if isinstance(spec, PathologicalSettings):
        return f"#C={spec.classes_per_client}"
    if isinstance(spec, ShardsSettings):
        return f"{spec.shards_per_client} shards/client"
    return "IID"
