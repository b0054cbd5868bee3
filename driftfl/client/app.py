"""The ClientApp: answers ``train``, ``evaluate`` and ``query.data-summary`` messages."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from driftfl.common.config import from_json
from driftfl.common.evaluation import evaluate as evaluate_model
from driftfl.common.models import build_model
from driftfl.common.protocol import (ARRAYS, CONFIG, DATA_SUMMARY, DATASET_META, EXPERIMENT,
                                     LABEL_HISTOGRAM,
                                     LOCAL_STEPS, METHOD, METRICS, NUM_EXAMPLES, PARTITION_ID,
                                     SERVER_ROUND, TRAIN_LOSS, DatasetMeta, load_arrays,
                                     model_to_arrays)

from .data import LocalData, local_data
from .objectives import build_objective
from .train import TrainSettings, train_locally

app = ClientApp()


def _job(msg: Message, context: Context):
    config = msg.content[CONFIG]
    experiment = from_json(str(config[EXPERIMENT]))
    meta = DatasetMeta.from_json(str(config[DATASET_META]))
    return experiment, meta, local_data(experiment, meta, context.node_config)


def _model(experiment, meta: DatasetMeta, msg: Message) -> torch.nn.Module:
    model = build_model(experiment.model, meta.shape, len(meta.classes))
    load_arrays(model, msg.content[ARRAYS])
    return model.to(experiment.device)


def _generator(experiment, server_round: int, data: LocalData) -> torch.Generator:
    """Shuffling differs per round and client but is fixed by the experiment seed."""
    key = [int(experiment.seed), server_round, data.partition_id + 1]
    return torch.Generator().manual_seed(int(np.random.SeedSequence(key).generate_state(1)[0]))


@app.train()
def train(msg: Message, context: Context) -> Message:
    experiment, meta, data = _job(msg, context)
    config = msg.content[CONFIG]
    model = _model(experiment, meta, msg)
    objective = build_objective(str(config[METHOD]), experiment.strategy, msg)
    settings = TrainSettings(int(experiment.local_epochs), int(experiment.batch_size),
                             float(experiment.lr), float(experiment.momentum),
                             float(experiment.weight_decay))
    stats = train_locally(model, data.x.to(experiment.device), data.y.to(experiment.device),
                          settings, objective,
                          _generator(experiment, int(config[SERVER_ROUND]), data))
    metrics = MetricRecord({NUM_EXAMPLES: stats.num_examples, LOCAL_STEPS: stats.steps,
                            TRAIN_LOSS: stats.mean_loss, **objective.diagnostics()})
    return Message(RecordDict({ARRAYS: model_to_arrays(model), METRICS: metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The received model on this node's own data."""
    experiment, meta, data = _job(msg, context)
    model = _model(experiment, meta, msg)
    loss, accuracy, _ = evaluate_model(model, data.x.to(experiment.device),
                                       data.y.to(experiment.device),
                                       int(experiment.eval_batch_size), len(meta.classes))
    metrics = MetricRecord({NUM_EXAMPLES: len(data), "local-loss": loss,
                            "local-accuracy": accuracy})
    return Message(RecordDict({METRICS: metrics}), reply_to=msg)


@app.query(DATA_SUMMARY)
def data_summary(msg: Message, context: Context) -> Message:
    """How much of each class this node holds (and which partition it is)."""
    _, meta, data = _job(msg, context)
    histogram = torch.bincount(data.y, minlength=len(meta.classes)).tolist()
    metrics = MetricRecord({PARTITION_ID: data.partition_id, NUM_EXAMPLES: len(data),
                            LABEL_HISTOGRAM: histogram})
    return Message(RecordDict({METRICS: metrics}), reply_to=msg)
