"""The operator's caps on what a server may ask of this node (``max-*`` in --node-config).

Checked when a message arrives, before the node reads its data or trains: a request over a
cap is refused with an error reply that names the setting and the cap.
"""

from __future__ import annotations

import torch
from flwr.app import Message

from driftfl.dcfl.settings import condensation_settings
from driftfl.common.conditions import ASSIGNED_EPOCHS, ASSIGNMENT
from driftfl.common.config import ExperimentConfig
from driftfl.common.errors import ConfigError
from driftfl.common.models import build_model
from driftfl.common.protocol import CONDENSE, CONFIG, DCFL_CONDENSE, DatasetMeta

from .node import NodeConfig


def parameter_count(experiment: ExperimentConfig, meta: DatasetMeta) -> int:
    """The experiment's model's parameter count, built on the meta device: no memory is
    spent on a model that may be refused."""
    with torch.device("meta"):
        model = build_model(experiment.model, meta.shape, len(meta.classes))
    return sum(p.numel() for p in model.parameters())


def runs_dcfl(msg: Message, experiment: ExperimentConfig) -> bool:
    """Whether DCFL's client stages (condensation, fine-tuning) are or will be asked for."""
    return (experiment.strategy.name == "dcfl" or CONDENSE in msg.content[CONFIG]
            or msg.metadata.message_type.endswith(f".{DCFL_CONDENSE}"))


def check_caps(msg: Message, experiment: ExperimentConfig, meta: DatasetMeta,
               node: NodeConfig) -> None:
    """ConfigError naming the first request over one of the node's caps."""
    asked = [("local_epochs", experiment.local_epochs, "max-local-epochs",
              node.max_local_epochs),
             ("batch_size", experiment.batch_size, "max-batch-size", node.max_batch_size)]
    assigned = msg.content.config_records.get(ASSIGNMENT)
    if assigned is not None and ASSIGNED_EPOCHS in assigned:  # heterogeneity=epochs' draw
        asked.append(("the assigned local epochs", int(assigned[ASSIGNED_EPOCHS]),
                      "max-local-epochs", node.max_local_epochs))
    if runs_dcfl(msg, experiment):
        dcfl = condensation_settings(experiment.strategy.model_dump())
        asked += [("strategy.finetune_epochs", dcfl.finetune_epochs, "max-local-epochs",
                   node.max_local_epochs),
                  ("strategy.finetune_batch_size", dcfl.finetune_batch_size, "max-batch-size",
                   node.max_batch_size),
                  ("strategy.condense_iterations", dcfl.condense_iterations,
                   "max-condense-iterations", node.max_condense_iterations)]
    for setting, value, key, cap in asked:
        if cap is not None and value > cap:
            raise ConfigError(f"{setting} {value} exceeds this node's {key}={cap}")
    if node.max_parameters is not None:
        count = parameter_count(experiment, meta)
        if count > node.max_parameters:
            raise ConfigError(f"model {experiment.model.name} has {count} parameters, which "
                              f"exceeds this node's max-parameters={node.max_parameters}")
