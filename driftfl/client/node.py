"""What a node's operator allows, and whether this node is a simulated one.

In deployment the node's data, limits and privacy floor come only from the operator's
``--node-config`` (a SuperNode's own command line); nothing in a message chooses a path, starts
a download, raises a limit or lowers the floor. In simulation every node belongs to the person running the experiment, so it
reads the experiment's dataset as the server names it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from pydantic import Field, model_validator

from driftfl.common.datasets import DATASETS, OwnDataSettings
from driftfl.common.errors import ConfigError, lookup
from driftfl.common.privacy_floor import PrivacyFloor
from driftfl.common.settings import nearest, validated

# The one task that runs a ClientApp in Flower's simulation: the Ray backend's actor method
# (flwr/simulation/ray_transport/ray_actor.py, started by server/superlink/fleet/vce).
SIMULATION_TASK = "flwr.simulation.ray_transport.ray_actor.ClientAppActor.run"

NO_DATA_NAMED = (
    "this node names no data of its own: add data-dir='<folder or .npz>', or "
    "dataset='<name>' partition-id=<i> num-partitions=<n> (and dataset-root='<dir>' unless "
    "the dataset is in its default place) to the SuperNode's --node-config")


def in_simulation() -> bool:
    """Whether this handler runs inside Flower's simulation engine.

    Only node-local facts decide: the handler is running as the Ray task
    ``ClientAppActor.run``, which exists only in a process the simulation's Ray backend
    started. A deployment ClientApp runs in a ``flwr-clientapp`` process (or, with Flower's
    legacy ``start_client``, inside the client's own process): no Ray there, so False. A
    message cannot make its receiver a Ray actor, so a server cannot claim simulation.
    Everything else, direct calls in tests included, counts as deployment (fail closed).
    """
    ray = sys.modules.get("ray")  # never imported here: certainly not a Ray worker
    if ray is None or not ray.is_initialized():
        return False
    try:
        return ray.get_runtime_context().get_task_function_name() == SIMULATION_TASK
    except Exception:  # noqa: BLE001 (not a Ray worker after all, or an older Ray)
        return False


def _key(name: str, **constraints: Any):
    """An optional --node-config key: the field is named with '_', the key with '-'."""
    return Field(None, alias=name, **constraints)


class NodeConfig(PrivacyFloor):
    """A SuperNode's ``--node-config``, checked. Values arrive typed by Flower's parser (TOML:
    ``max-parameters=1_000_000`` is an int, ``dataset='fmnist'`` a string, ``true`` a bool).
    Beside its data and caps, the least privacy it accepts (``min-privacy``, ...:
    driftfl.common.privacy_floor)."""

    # which data: a partition (simulation, or with `dataset` in deployment) or its own files
    partition_id: int | None = _key("partition-id", ge=0)
    num_partitions: int | None = _key("num-partitions", ge=1)
    data_dir: str | None = _key("data-dir", min_length=1)  # a folder or an .npz: all its data
    dataset: str | None = _key("dataset", min_length=1)  # a registry name, e.g. fmnist
    dataset_root: str | None = _key("dataset-root", min_length=1)  # None: its default place
    dataset_download: bool = Field(False, alias="dataset-download")  # fetch it when missing
    # what a server may ask of this node; None: no cap
    max_parameters: int | None = _key("max-parameters", ge=1)
    max_local_epochs: int | None = _key("max-local-epochs", ge=1)
    max_batch_size: int | None = _key("max-batch-size", ge=1)
    max_condense_iterations: int | None = _key("max-condense-iterations", ge=1)
    # torch threads for this node's training: 1, as a simulated client has by default, gives
    # the same bytes as simulation; more is faster and differs in float rounding
    threads: int = Field(1, alias="threads", ge=1, le=1024)

    @model_validator(mode="after")
    def _one_source_of_data(self) -> NodeConfig:
        partition = (self.partition_id, self.num_partitions)
        if (partition[0] is None) != (partition[1] is None):
            raise ValueError("partition-id and num-partitions go together: give both")
        if partition[0] is not None and partition[0] >= partition[1]:
            raise ValueError(f"partition-id {partition[0]} is outside "
                             f"0..{partition[1] - 1} (num-partitions={partition[1]})")
        if self.data_dir and self.dataset:
            raise ValueError("data-dir and dataset both name this node's data: keep one")
        if self.data_dir and partition[0] is not None:
            raise ValueError("data-dir is this node's whole data: drop partition-id and "
                             "num-partitions")
        if (self.dataset_root or self.dataset_download) and not self.dataset:
            raise ValueError("dataset-root and dataset-download need dataset='<name>'")
        if self.dataset:
            settings = lookup("dataset", self.dataset, {n: e[0] for n, e in DATASETS.items()})
            if partition[0] is None:
                raise ValueError(f"dataset='{self.dataset}' needs partition-id=<i> "
                                 "num-partitions=<n>: this node's share of it")
            if issubclass(settings, OwnDataSettings) and not self.dataset_root:
                raise ValueError(f"dataset '{self.dataset}' has no default place: add "
                                 "dataset-root='<path>'")
        return self

    @property
    def reads_experiment_partition(self) -> bool:
        """Its data is its share of the experiment's dataset as the server names it (a
        simulated node's): no dataset or folder of the operator's own."""
        return self.partition_id is not None and not (self.dataset or self.data_dir)


def keys() -> list[str]:
    return sorted(field.alias for field in NodeConfig.model_fields.values())


def node_config(data: Mapping[str, Any]) -> NodeConfig:
    """The node's ``--node-config`` (Context.node_config) checked; ConfigError says what is
    wrong in one line."""
    unknown = sorted(set(data) - set(keys()))
    if unknown:
        guess = nearest(unknown[0], keys())
        hint = f" (did you mean {guess}?)" if guess else ""
        raise ConfigError(f"unknown --node-config key '{unknown[0]}'{hint}; valid keys: "
                          f"{', '.join(keys())}")
    return validated(NodeConfig, data, "--node-config ")
