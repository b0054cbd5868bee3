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

import numpy as np

from .errors import ConfigError, lookup
from .paths import cache_dir

PARTITIONS = ("iid", "dirichlet", "pathological", "shards")


def check_partition(spec: Mapping, num_clients: int, num_classes: int, num_samples: int) -> None:
    """Raise ConfigError for a partition that cannot be made, before any work starts."""
    lookup("partition", spec["name"], dict.fromkeys(PARTITIONS))
    if num_clients < 1:
        raise ConfigError(f"num_clients must be at least 1, got {num_clients}")
    if num_clients > num_samples:
        raise ConfigError(f"num_clients={num_clients} is more than the {num_samples} training "
                          "samples; use fewer clients or a larger dataset.subset")
    name = spec["name"]
    if name == "dirichlet":
        if not float(spec["alpha"]) > 0:
            raise ConfigError(f"partition.alpha must be > 0, got {spec['alpha']}")
        if int(spec["min_size"]) * num_clients > num_samples:
            raise ConfigError(
                f"partition.min_size={spec['min_size']} x {num_clients} clients exceeds the "
                f"{num_samples} training samples; lower partition.min_size")
    elif name == "pathological":
        k = int(spec["classes_per_client"])
        if not 1 <= k <= num_classes:
            raise ConfigError(f"partition.classes_per_client must be in 1..{num_classes}, got {k}")
        lookup("partition.assignment", spec["assignment"],
               dict.fromkeys(("random", "deterministic", "first-deterministic")))
    elif name == "shards":
        shards = int(spec["shards_per_client"])
        if shards < 1 or shards * num_clients > num_samples:
            raise ConfigError(f"partition.shards_per_client={shards} must be >= 1 and leave "
                              f"each of the {num_clients * shards} shards a sample")


def _partitioner(spec: Mapping, num_clients: int, seed: int):
    from flwr_datasets import partitioner as fp

    name = spec["name"]
    if name == "iid":
        return fp.IidPartitioner(num_partitions=num_clients)
    if name == "dirichlet":
        return fp.DirichletPartitioner(
            num_partitions=num_clients, partition_by="label", alpha=float(spec["alpha"]),
            min_partition_size=int(spec["min_size"]),
            self_balancing=bool(spec.get("self_balancing", False)), seed=seed)
    if name == "pathological":
        return fp.PathologicalPartitioner(
            num_partitions=num_clients, partition_by="label",
            num_classes_per_partition=int(spec["classes_per_client"]),
            class_assignment_mode=spec["assignment"], seed=seed)
    return fp.ShardPartitioner(num_partitions=num_clients, partition_by="label",
                               num_shards_per_partition=int(spec["shards_per_client"]), seed=seed)


def compute_partition(labels: np.ndarray, spec: Mapping, num_clients: int,
                      seed: int) -> list[np.ndarray]:
    """Indices into ``labels`` for each client (no cache)."""
    from datasets import Dataset

    table = Dataset.from_dict({"label": labels, "index": np.arange(len(labels))})
    if spec["name"] == "iid":  # IidPartitioner cuts contiguous shards: shuffle first
        table = table.shuffle(seed=seed)
    partitioner = _partitioner(spec, num_clients, seed)
    partitioner.dataset = table
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one warning per Dirichlet redraw
            return [np.asarray(partitioner.load_partition(i)["index"], dtype=np.int64)
                    for i in range(num_clients)]
    except ValueError as err:
        if spec["name"] == "dirichlet":
            raise ConfigError(
                f"Dirichlet(alpha={spec['alpha']}) could not give each of {num_clients} clients "
                f"at least partition.min_size={spec['min_size']} samples in 11 draws; raise "
                "partition.alpha, lower partition.min_size or use fewer clients") from err
        raise ConfigError(f"partition '{spec['name']}' failed: {err}") from err


def holdout_indices(labels: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """``per_class`` samples of every class, drawn by ``seed``, that the server keeps and no
    client ever receives (FedSSD's auxiliary set); sorted indices into ``labels``."""
    rng = np.random.default_rng([seed, 7])  # a stream of its own, apart from the partitioner's
    chosen = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        if len(members) <= per_class:
            raise ConfigError(f"the server's auxiliary set wants {per_class} samples of class {c}, "
                              f"which has only {len(members)}; lower strategy.aux_per_class")
        chosen.append(rng.choice(members, size=per_class, replace=False))
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


def _cache_key(labels: np.ndarray, spec: Mapping, num_clients: int, seed: int,
               holdout: np.ndarray) -> str:
    digest = hashlib.sha256(np.ascontiguousarray(labels).tobytes())
    digest.update(np.ascontiguousarray(holdout, dtype=np.int64).tobytes())
    digest.update(json.dumps([dict(spec), num_clients, seed], sort_keys=True).encode())
    return f"{spec['name']}-{num_clients}-{digest.hexdigest()[:20]}"


def partition(labels: np.ndarray, spec: Mapping, num_clients: int, seed: int,
              holdout: np.ndarray | None = None) -> list[np.ndarray]:
    """Indices into ``labels`` for each client, read from or written to the disk cache. Samples
    in ``holdout`` (the server's) are left out before partitioning."""
    holdout = np.zeros(0, dtype=np.int64) if holdout is None else np.asarray(holdout)
    key = _cache_key(labels, spec, num_clients, seed, holdout)
    path = cache_dir() / "partitions" / f"{key}.npz"
    if path.is_file():
        with np.load(path) as cached:
            return [cached[f"client{i}"] for i in range(num_clients)]
    pool = np.setdiff1d(np.arange(len(labels)), holdout)
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


def describe(spec: Mapping) -> str:
    """A short human name for a partition, e.g. 'Dirichlet(0.5)' or '#C=2'."""
    name = spec["name"]
    if name == "dirichlet":
        return f"Dirichlet({spec['alpha']})"
    if name == "pathological":
        return f"#C={spec['classes_per_client']}"
    if name == "shards":
        return f"{spec['shards_per_client']} shards/client"
    return "IID"
