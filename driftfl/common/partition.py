"""Split a dataset's training labels over clients with flwr-datasets partitioners.

Indices are cached on disk by (labels, partitioner and its parameters, client count, seed) as
one flat array with offsets, read once per process: a simulated client finds its share in
microseconds however many clients there are, instead of re-running the partitioner.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Mapping
from functools import lru_cache
from typing import Literal

import numpy as np
from pydantic import Field

from .errors import ConfigError
from .paths import cache_dir
from .settings import MANY, Settings, section
from .untrusted import replaced


class PartitionSettings(Settings):
    """The ``partition`` section; IID takes nothing more."""

    name: str


class DirichletSettings(PartitionSettings):
    alpha: float = Field(0.5, gt=0, description=(
        "each class is split over the clients by proportions drawn from Dir(alpha): smaller is "
        "more skewed (the papers use 0.01 .. 5)"))
    min_size: int = Field(10, ge=0, le=MANY, description=(
        "redraw until every client holds at least this many samples"))
    self_balancing: bool = Field(False, description=(
        "flwr-datasets' balancing of partition sizes"))


class PathologicalSettings(PartitionSettings):
    classes_per_client: int = Field(2, description=(
        "the labels each client holds (#C=k): 1 .. the number of classes, checked against the "
        "dataset"))
    assignment: Literal["covering", "random", "deterministic", "first-deterministic"] = Field(
        "covering", description=(
            "covering: every label held whenever clients x classes_per_client >= classes; "
            "random, deterministic, first-deterministic: flwr-datasets' modes (random may drop "
            "labels)"))


class ShardsSettings(PartitionSettings):
    shards_per_client: int = Field(2, ge=1, le=MANY, description=(
        "label-sorted shards each client gets (FedAvg's sort-and-shard split)"))


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
    spec = partition_settings(spec)
    if spec.name == "iid":
        return iid_partition(len(labels), num_clients, seed)
    if isinstance(spec, PathologicalSettings) and spec.assignment == "covering":
        return covering_partition(labels, spec.classes_per_client, num_clients, seed)
    from datasets import Dataset

    table = Dataset.from_dict({"label": labels, "index": np.arange(len(labels))})
    partitioner = _partitioner(spec, num_clients, seed)
    partitioner.dataset = table
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one warning per Dirichlet redraw
            return [np.asarray(partitioner.load_partition(i).with_format("numpy")["index"][:],
                               dtype=np.int64) for i in range(num_clients)]
    except ValueError as err:
        if isinstance(spec, DirichletSettings):
            raise ConfigError(
                f"Dirichlet(alpha={spec.alpha:g}) could not give each of {num_clients} clients "
                f"at least partition.min_size={spec.min_size} samples in 11 draws; raise "
                "partition.alpha, lower partition.min_size or use fewer clients") from err
        raise ConfigError(f"partition '{spec.name}' failed: {err}") from err


def iid_partition(num_samples: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """What flwr-datasets' IidPartitioner gives after Hugging Face's ``shuffle(seed)``: the
    shuffled indices cut into contiguous shards, the first ``num_samples % num_clients`` one
    longer (a test pins the equality). Computed here because the library's ``shard`` costs
    about 8 ms a client: 80 s for 10,000 clients."""
    order = np.random.default_rng(seed).permutation(num_samples).astype(np.int64)
    return np.array_split(order, num_clients)


def covering_assignment(num_clients: int, classes: list[int], per_client: int,
                        rng: np.random.Generator) -> list[list[int]]:
    """The labels each client holds under #C=k. Client i's first label is i mod K, as in
    NIID-Bench; its other slots are filled a slot at a time across the clients, first with the
    labels no client got first (there are some when clients < K), then with random labels it
    does not hold yet. Every label is held when clients x k >= K."""
    held = [[classes[i % len(classes)]] for i in range(num_clients)]
    unheld = [int(c) for c in rng.permutation(classes[num_clients:])]
    for _ in range(1, per_client):
        for labels in held:
            if unheld:
                labels.append(unheld.pop())
            else:
                labels.append(int(rng.choice([c for c in classes if c not in labels])))
    return held


def covering_partition(labels: np.ndarray, per_client: int, num_clients: int,
                       seed: int) -> list[np.ndarray]:
    """#C=k with ``covering_assignment``: each label's samples, in a seeded random order, cut
    into equal shares for the clients that hold it (the flwr-datasets modes cut them the same
    way)."""
    rng = np.random.default_rng(seed)
    classes = [int(c) for c in np.unique(labels)]
    held = covering_assignment(num_clients, classes, per_client, rng)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in classes:
        holders = [i for i, mine in enumerate(held) if c in mine]
        if not holders:  # clients x k < K: the run warns of the classes left out
            continue
        members = rng.permutation(np.flatnonzero(labels == c))
        if len(members) < len(holders):
            raise ConfigError(f"class {c} has {len(members)} samples for {len(holders)} "
                              "clients that hold it under #C=k; use fewer clients or a larger "
                              "dataset.subset")
        for i, share in zip(holders, np.array_split(members, len(holders))):
            parts[i].append(share)
    return [np.sort(np.concatenate(p)).astype(np.int64) if p else np.zeros(0, dtype=np.int64)
            for p in parts]


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
    return f"{spec.name}-{num_clients}-{digest.hexdigest()[:20]}-flat"


def partition(labels: np.ndarray, spec: Mapping | PartitionSettings, num_clients: int, seed: int,
              aux: np.ndarray | None = None) -> list[np.ndarray]:
    """Indices into ``labels`` for each client, read from or written to the disk cache. Samples
    in ``aux`` (the server's aux set) are left out before partitioning."""
    indices, offsets = _partition_table(labels, spec, num_clients, seed, aux)
    return np.split(indices, offsets[1:-1])


def client_partition(labels: np.ndarray, spec: Mapping | PartitionSettings, num_clients: int,
                     seed: int, aux: np.ndarray | None, client: int) -> np.ndarray:
    """One client's indices (``partition(...)[client]`` without building every client's)."""
    indices, offsets = _partition_table(labels, spec, num_clients, seed, aux)
    return indices[offsets[client]:offsets[client + 1]]


def _partition_table(labels: np.ndarray, spec: Mapping | PartitionSettings, num_clients: int,
                     seed: int, aux: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Every client's indices end to end, and where each client's start (num_clients + 1)."""
    spec = partition_settings(spec)
    aux = np.zeros(0, dtype=np.int64) if aux is None else np.asarray(aux)
    path = cache_dir() / "partitions" / f"{_cache_key(labels, spec, num_clients, seed, aux)}.npz"
    if path.is_file():
        return _read_table(str(path))
    pool = np.setdiff1d(np.arange(len(labels)), aux)
    parts = [pool[p] for p in compute_partition(labels[pool], spec, num_clients, seed)]
    offsets = np.cumsum([0, *map(len, parts)]).astype(np.int64)
    indices = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename: clients starting together never read a half-written file.
    with replaced(path, "wb") as f:
        np.savez(f, indices=indices, offsets=offsets)
    return indices, offsets


@lru_cache(maxsize=4)
def _read_table(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Read once per process (a simulation worker serves every client of the run)."""
    with np.load(path, allow_pickle=False) as cached:
        indices, offsets = cached["indices"], cached["offsets"]
    indices.flags.writeable = offsets.flags.writeable = False  # shared by every caller
    return indices, offsets


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
