"""Everything a handler knows about the message it is answering, in one place."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import torch
from flwr.app import ConfigRecord, Context, Message, MessageType

from driftfl.common.blas import one_blas_thread
from driftfl.common.config import ExperimentConfig
from driftfl.common.errors import ConfigError
from driftfl.common.privacy_floor import floor_refusal
from driftfl.common.models import DriftModel, build_model
from driftfl.common.protocol import (ASSIGNED_PARTITION, CONDENSE, CONFIG, CSD_PROTOTYPES,
                                     DATA_SUMMARY, DATASET_META, DCFL_CONDENSE, EXPERIMENT,
                                     NUM_PARTITIONS, SERVER_ROUND, DatasetMeta, load_arrays)

from . import node
from .caps import check_caps
from .data import LocalData, local_data
from .secure import is_secagg

PINNED = "driftfl.experiment"  # the node's state record: the digest of the run's experiment


@dataclass
class ClientJob:
    experiment: ExperimentConfig
    meta: DatasetMeta
    data: LocalData
    message: Message
    context: Context

    @classmethod
    def from_message(cls, msg: Message, context: Context) -> ClientJob:
        allowed = node.node_config(context.node_config)  # the operator's, checked first
        config = msg.content[CONFIG]
        if (ASSIGNED_PARTITION in config and allowed.reads_experiment_partition
                and node.in_simulation()):  # the server's assignment (server/simulated.py)
            allowed = allowed.model_copy(update={"partition_id": int(config[ASSIGNED_PARTITION]),
                                                 "num_partitions": int(config[NUM_PARTITIONS])})
        pin_experiment(context, str(config[EXPERIMENT]) + str(config[DATASET_META]))
        experiment = ExperimentConfig.from_json(str(config[EXPERIMENT]))
        meta = DatasetMeta.from_json(str(config[DATASET_META]))
        check_floor(msg, experiment, allowed)
        check_caps(msg, experiment, meta, allowed)  # before reading data or training
        # the thread count changes float sums: a simulated client's cores, or the operator's
        one_blas_thread()  # NumPy's vector work (DP's clip and noise) gains nothing from more
        torch.set_num_threads(min(experiment.simulation.client_cpus, os.cpu_count() or 1)
                              if node.in_simulation() else allowed.threads)
        data = local_data(experiment, meta, allowed, simulation=node.in_simulation())
        return cls(experiment, meta, data, msg, context)

    @property
    def device(self) -> torch.device:
        return torch.device(self.experiment.device)

    @property
    def server_round(self) -> int:
        return int(self.message.content[CONFIG].get(SERVER_ROUND, 0))

    @property
    def num_classes(self) -> int:
        return len(self.meta.classes)

    def model(self, record: str) -> DriftModel:
        """A model of the experiment's architecture holding the message's ``record`` arrays."""
        model = build_model(self.experiment.model, self.meta.shape, self.num_classes)
        load_arrays(model, self.message.content[record], record)
        return model.to(self.device)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data.x.to(self.device), self.data.y.to(self.device)


def pin_experiment(context: Context, experiment: str) -> None:
    """Keep the run's first experiment (a digest in the node's state for the run); refuse a
    message that carries another: a server must not lower the privacy, or change what it asks,
    once a run has begun."""
    digest = hashlib.sha256(experiment.encode()).hexdigest()
    pinned = context.state.config_records.get(PINNED)
    if pinned is None:
        context.state[PINNED] = ConfigRecord({"sha256": digest})
    elif pinned["sha256"] != digest:
        raise ConfigError("the server sent another experiment than this run's first message "
                          "did; a node keeps the first experiment of a run: refused")


def check_floor(msg: Message, experiment: ExperimentConfig, allowed: node.NodeConfig) -> None:
    """ConfigError where the message asks for less privacy than the node accepts: its
    operator's --node-config, or in simulation its partition's entry in
    simulation.node_floors (every simulated node is the experimenter's own); and where it asks,
    under differential privacy (the experiment's or the floor's), for an answer no release
    covers (``private_refusal``). The data survey passes: what it discloses is the same under
    every privacy setting (docs/privacy.md), and a node refused later is one the run counts as
    a dropout, not a run that cannot start."""
    kind = msg.metadata.message_type
    if kind.endswith(f".{DATA_SUMMARY}"):
        return
    floor = allowed
    floors = experiment.simulation.node_floors or {}
    if node.in_simulation() and str(allowed.partition_id) in floors:
        floor = floors[str(allowed.partition_id)]
    training = kind == MessageType.TRAIN
    refusal = floor_refusal(floor, experiment, is_secagg(msg) if training else None)
    if refusal is None and (experiment.privacy.enabled or floor.min_privacy != "none"):
        refusal = private_refusal(kind, msg.content[CONFIG], experiment)
    if refusal:
        raise ConfigError(f"{refusal}: refused")


def private_refusal(kind: str, config, experiment: ExperimentConfig) -> str | None:
    """Why a node under differential privacy does not answer a message of ``kind``: its answer
    would be an exact figure of its data that no noise covers (docs/privacy.md lists each
    message and what it discloses); None where the release covers the answer (training)."""
    why = "which no noise covers; under differential privacy this node answers none"
    if kind == MessageType.EVALUATE:
        return f"evaluate asks for this node's exact loss and accuracy on its data, {why}"
    if kind.endswith(f".{CSD_PROTOTYPES}"):
        return f"the prototype query asks for this node's exact mean logits per class, {why}"
    if kind.endswith(f".{DCFL_CONDENSE}"):
        return ("the condensation query asks for images made from this node's data and its "
                f"trained classifier, {why}")
    if kind == MessageType.TRAIN and config.get(CONDENSE) and not getattr(
            experiment.strategy, "condense_dp", False):
        return ("the server asks for images made from this node's data (DCFL's condensed set) "
                "without condense_dp, which no noise covers")
    return None
