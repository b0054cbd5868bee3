"""Test-only: a deviating ServerApp, written against driftfl/common/protocol.py. To every node
it sends, under an experiment at privacy=distributed: a train message whose model holds one
array as int64; an evaluate of the model; a SecAgg+ setup with one client, one share and a
threshold of one. It writes what each node answered (its reply's error reason, or "answered")
to the JSON file the run config's ``out`` names."""

import json
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.serverapp import Grid, ServerApp

from driftfl.common.config import compose
from driftfl.common.datasets import FMNIST_CLASSES
from driftfl.common.models import build_model
from driftfl.common.protocol import (ARRAYS, CONFIG, DATASET_META, EXPERIMENT, METHOD,
                                     SERVER_ROUND, DatasetMeta)

app = ServerApp()
EXPERIMENT_JSON = compose(["model=mlp", "dataset.subset=2000", "dataset.test_subset=100",
                           "num_clients=2", "privacy=distributed",
                           "privacy.noise_multiplier=2", "privacy.clip=1"]).to_json()
META = DatasetMeta(list(FMNIST_CLASSES), [1, 28, 28], [0.286], [0.353]).to_json()


def model_arrays(int64: str = "") -> ArrayRecord:
    cfg = compose(["model=mlp"])
    state = build_model(cfg.model, (1, 28, 28), 10).state_dict()
    return ArrayRecord({k: Array(v.numpy().astype(np.int64) if k == int64 else v.numpy())
                        for k, v in state.items()})


def driftfl_message(kind: str, node: int, arrays: ArrayRecord) -> Message:
    config = ConfigRecord({EXPERIMENT: EXPERIMENT_JSON, DATASET_META: META, METHOD: "ce",
                           SERVER_ROUND: 1})
    return Message(RecordDict({ARRAYS: arrays, CONFIG: config}), dst_node_id=node,
                   message_type=kind)


def secagg_setup(node: int) -> Message:
    configs = ConfigRecord({Key.STAGE: Stage.SETUP, Key.SAMPLE_NUMBER: 1, Key.SHARE_NUMBER: 1,
                            Key.THRESHOLD: 1, Key.CLIPPING_RANGE: 8.0, Key.TARGET_RANGE: 1 << 22,
                            Key.MOD_RANGE: 1 << 32, Key.MAX_WEIGHT: 1000.0})
    return Message(RecordDict({RECORD_KEY_CONFIGS: configs}), dst_node_id=node,
                   message_type=MessageType.TRAIN)


@app.main()
def main(grid: Grid, context: Context) -> None:
    deadline = time.monotonic() + 120
    while len(nodes := sorted(grid.get_node_ids())) < 2 and time.monotonic() < deadline:
        time.sleep(1)
    cases = {"int64 array": lambda n: driftfl_message(MessageType.TRAIN, n,
                                                      model_arrays("features.1.weight")),
             "evaluate": lambda n: driftfl_message(MessageType.EVALUATE, n, model_arrays()),
             "secagg threshold 1": secagg_setup}
    said = {}
    for case, make in cases.items():
        replies = grid.send_and_receive([make(n) for n in nodes], timeout=120)
        said[case] = sorted(r.error.reason if r.has_error() else "answered" for r in replies)
    Path(str(context.run_config["out"])).write_text(json.dumps(said, indent=1))
