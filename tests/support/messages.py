"""Messages as a server sends them to a node, and the node's real ClientApp answering them in
this process (the SuperNode's part: a message, the node's config and its state)."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from driftfl.client.app import app
from driftfl.common.config import compose
from driftfl.common.datasets import FMNIST_CLASSES
from driftfl.common.protocol import CONFIG, DATASET_META, EXPERIMENT, DatasetMeta

FMNIST_META = DatasetMeta(list(FMNIST_CLASSES), [1, 28, 28], [0.286], [0.353])
TINY = ["model=mlp", "dataset.subset=2000", "dataset.test_subset=100"]


def experiment_json(overrides=()) -> str:
    """A checked experiment as a server sends it (the MLP on a subset of Fashion-MNIST)."""
    return compose([*TINY, *overrides]).to_json()


def message(message_type: str, experiment: str, records: dict | None = None,
            **config) -> Message:
    """A message of ``message_type`` carrying ``experiment``, the dataset's meta, ``config``'s
    further keys and ``records`` (an ArrayRecord or ConfigRecord each)."""
    content = RecordDict({CONFIG: ConfigRecord({EXPERIMENT: experiment,
                                                DATASET_META: FMNIST_META.to_json(),
                                                **config}), **(records or {})})
    return Message(content, dst_node_id=7, message_type=message_type)


def node_context(node_config: dict) -> Context:
    """A node of run 1 with ``node_config`` as its --node-config and a fresh state."""
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(),
                   run_config={})


def answer(msg: Message, context: Context) -> Message | str:
    """The node's reply to ``msg``, or its one line where it refuses (an error reply's
    reason, or what the ClientApp raised)."""
    try:
        reply = app(msg, context)
    except Exception as err:  # noqa: BLE001 - what the node says is the test's subject
        return str(err)
    return reply.error.reason if reply.has_error() else reply


def record(arrays: dict) -> ArrayRecord:
    """NumPy arrays by name as an ArrayRecord."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def arrays_of(model) -> ArrayRecord:
    """A model's state as the server sends it."""
    return record({k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})
