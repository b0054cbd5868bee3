"""The ClientApp: answers ``train``, ``evaluate`` and the queries of the data survey, of
FedCSD's prototype phase and of DCFL's pre-training stage. Every handler starts with
ClientJob.from_message, which checks the operator's node config and caps and reads only the
data the node may read (see node.py); the mod keeps node paths out of error replies."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from driftfl.common.client_split import ACC_AFTER, ACC_BEFORE
from driftfl.common.evaluation import evaluate as evaluate_model
from driftfl.common.protocol import (ARRAYS, CLASSIFIER, CONDENSE, CONDENSED, CONFIG,
                                     CSD_PROTOTYPES, DATA_SUMMARY, DCFL_CONDENSE,
                                     LABEL_HISTOGRAM, LOCAL_STEPS, METHOD, METRICS, NUM_EXAMPLES,
                                     PARTITION_ID, PROTOTYPES, TRAIN_LOSS, model_to_arrays,
                                     summed_payload)

from .assignment import evaluates, held_out_accuracy, local_stage
from driftfl.dcfl.client import DCFLClient, is_dcfl, received_images, to_record
from .job import ClientJob
from .objectives import build_objective
from .objectives.csd import prototype_reply
from .privacy import disclosed_metrics, noise_shares, privatise, privatise_payload
from .redaction import keep_paths_local
from .secure import SECAGG_MODS
from .train import LogitShift, train_locally

# error replies carry no node paths; SecAgg+ messages go through Flower's secaggplus_mod (the
# others pass those mods untouched)
app = ClientApp(mods=[keep_paths_local, *SECAGG_MODS])


def _seed(job: ClientJob, purpose: int) -> int:
    """Randomness differs per round, client and purpose, and is fixed by the experiment seed."""
    key = [job.experiment.seed, job.server_round, job.data.partition_id + 1, purpose]
    return int(np.random.SeedSequence(key).generate_state(1)[0])


@app.train()
def train(msg: Message, context: Context) -> Message:
    job = ClientJob.from_message(msg, context)
    exp = job.experiment
    model = job.model(ARRAYS)
    objective = build_objective(str(msg.content[CONFIG][METHOD]), exp.strategy, job)
    x, y = job.tensors()
    shift = LogitShift(model, x, exp.logit_shift_samples,
                       torch.Generator().manual_seed(_seed(job, 1)))

    generator = torch.Generator().manual_seed(_seed(job, 0))
    records, extra = {}, {}
    if evaluates(job):  # per-client evaluation: the global model on the held-out split
        extra[ACC_BEFORE] = held_out_accuracy(job, model)
    if not is_dcfl(msg):
        stats = train_locally(model, x, y, local_stage(job), objective, generator)
    else:  # DCFL: condense if asked, then the local and the fine-tuning stage
        dcfl = DCFLClient.of(job)
        if msg.content[CONFIG][CONDENSE]:
            images, labels, disclosed = dcfl.condense(
                x, y, torch.Generator().manual_seed(_seed(job, 2)))
            records[CONDENSED] = to_record(images, labels)
            extra.update(disclosed)
        stats = dcfl.train(model, x, y, objective, generator, received_images(msg, job),
                           local_stage(job))
    objective.after_training(model, stats)
    if evaluates(job):  # ... and the locally trained model on it
        extra[ACC_AFTER] = held_out_accuracy(job, model)
    metrics = MetricRecord(disclosed_metrics({
        NUM_EXAMPLES: stats.num_examples, LOCAL_STEPS: stats.steps, TRAIN_LOSS: stats.mean_loss,
        "logit-shift": shift.measure(model), **objective.diagnostics(), **extra}, exp.privacy))
    shares = noise_shares(exp)
    arrays = privatise(model_to_arrays(model), msg.content[ARRAYS], exp.privacy, shares)
    records = privatise_payload({**records, **objective.reply_records()}, exp.privacy, shares,
                                summed_payload(msg.content[CONFIG]))
    return Message(RecordDict({ARRAYS: arrays, METRICS: metrics, **records}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The received model on this node's own data."""
    job = ClientJob.from_message(msg, context)
    loss, accuracy, _ = evaluate_model(job.model(ARRAYS), *job.tensors(),
                                       job.experiment.eval_batch_size, job.num_classes)
    metrics = MetricRecord({NUM_EXAMPLES: len(job.data), "local-loss": loss,
                            "local-accuracy": accuracy})
    return Message(RecordDict({METRICS: metrics}), reply_to=msg)


@app.query(DATA_SUMMARY)
def data_summary(msg: Message, context: Context) -> Message:
    """How much of each class this node holds (and which partition it is)."""
    job = ClientJob.from_message(msg, context)
    histogram = torch.bincount(job.data.y, minlength=job.num_classes).tolist()
    metrics = MetricRecord({PARTITION_ID: job.data.partition_id, NUM_EXAMPLES: len(job.data),
                            LABEL_HISTOGRAM: histogram})
    return Message(RecordDict({METRICS: metrics}), reply_to=msg)


@app.query(CSD_PROTOTYPES)
def csd_prototypes(msg: Message, context: Context) -> Message:
    """FedCSD's prototype phase: the teacher's mean logits per class on this node's data."""
    prototypes, n = prototype_reply(ClientJob.from_message(msg, context))
    return Message(RecordDict({PROTOTYPES: prototypes, METRICS: MetricRecord({NUM_EXAMPLES: n})}),
                   reply_to=msg)


@app.query(DCFL_CONDENSE)
def dcfl_condense(msg: Message, context: Context) -> Message:
    """DCFL's pre-training request: condense this node's data, train E_c epochs from the
    received model on the local data, and return the condensed set and the classifier."""
    job = ClientJob.from_message(msg, context)
    dcfl = DCFLClient.of(job)
    x, y = job.tensors()
    images, labels, disclosed = dcfl.condense(x, y, torch.Generator().manual_seed(_seed(job, 2)))
    model = job.model(ARRAYS)
    objective = build_objective("ce", {}, job)
    dcfl.train(model, x, y, objective, torch.Generator().manual_seed(_seed(job, 0)), None)
    classifier = ArrayRecord({"weight": Array(model.head.weight.detach().cpu().numpy())})
    metrics = MetricRecord({NUM_EXAMPLES: len(y), **disclosed})
    return Message(RecordDict({CONDENSED: to_record(images, labels), CLASSIFIER: classifier,
                               METRICS: metrics}), reply_to=msg)
