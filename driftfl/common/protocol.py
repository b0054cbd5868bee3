"""The wire protocol: the only thing the ClientApp and the strategies agree on.

Server -> client ``train``: record ``arrays`` (the global model) and ``config`` with
``experiment`` (the checked experiment as JSON), ``dataset-meta`` (classes, image shape,
normalisation, so a node with its own folder reads its images the same way), ``method`` (the
local objective) and ``server-round``. Methods add their own named records (``teacher``, ...)
and config keys (FedProx's ``proximal-mu``).

Client -> server reply: ``arrays`` (the updated model) and ``metrics`` with ``num-examples``,
``local-steps``, ``train-loss`` and the objective's diagnostics; statistics go in further
named records.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from driftfl.common.errors import ConfigError

if TYPE_CHECKING:  # the names are checked against experiments before torch or Flower loads
    from flwr.app import ArrayRecord
    from torch import nn

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"

# keys in the train/evaluate ``config`` record
SERVER_ROUND = "server-round"
EXPERIMENT = "experiment"
DATASET_META = "dataset-meta"
METHOD = "method"
PROXIMAL_MU = "proximal-mu"  # FedProx's mu, as Flower's FedProx sends it
PROTOTYPES_IN_REPLY = "prototypes-in-reply"  # FedCSD, prototypes=previous: reply with this
#                                              round's P_k (see CSD_PROTOTYPES)
# the release sums payloads (DP, secure aggregation): the reply record a method's clients send
# as their term of that sum, and its arrays summed, in order (FedCurv: the change of its terms,
# not the terms); the method declares them once (its strategy's payload_record and payload()),
# and a client clips, noises or masks exactly these (``summed_payload``)
SUMMED_PAYLOAD = "summed-payload"
SUMMED_ARRAYS = "summed-arrays"
# secagg: a client sends its payload term times this over its weight, so that SecAgg+'s
# weighted sum gives each term / m (the round's max weight over its m clients)
PAYLOAD_SCALE = "payload-scale"

# keys in the reply ``metrics`` record
NUM_EXAMPLES = "num-examples"
LOCAL_STEPS = "local-steps"
TRAIN_LOSS = "train-loss"
CLASS_ALPHA = "class-alpha"  # FedCAD's alpha_y per class
# the reply metrics that are a list (a value per class); every other metric is one number
PER_CLASS_METRICS = frozenset({CLASS_ALPHA})

# the query that asks a node what data it holds (answered before the first round)
DATA_SUMMARY = "data_summary"  # message type "query.data_summary"
PARTITION_ID = "partition-id"
LABEL_HISTOGRAM = "label-histogram"
# simulation only, in the config of every message: the partition the server assigned to the
# receiving node, and how many there are (see driftfl/server/simulated.py)
ASSIGNED_PARTITION = "assigned-partition"
NUM_PARTITIONS = "num-partitions"

# knowledge records a strategy may send with the global model
TEACHER = "teacher"  # a teacher model's arrays (FedCSD's EMA teacher, FedGKD's buffer mean)
PROTOTYPES = "prototypes"  # FedCSD's global class prototypes: arrays "prototypes" (C, C)

CREDIBILITY = "credibility"  # FedSSD: arrays "matrix" (C, C), the global model's row-normalised
#                               confusion on the server's aux set
CLASS_PHI = "class-phi"  # FedCAD with alpha_source=aux: arrays "phi" (C,), E_{x|y}[phi] on the
#                          aux set; without it a client estimates E_{x|y}[phi] on its own data

# FedCurv: the train message's "fisher-penalty" holds, per trainable parameter name k, arrays
# "penalty.<k>" = sum_{j != node} F_j and "anchor.<k>" = sum_{j != node} F_j * w_j (per node);
# the reply's "fisher" holds the node's diagonal Fisher F_k, one array per parameter name
FISHER_PENALTY = "fisher-penalty"
FISHER = "fisher"
# FedCurv under privacy or secagg (fedcurv.py): the reply's "fisher-delta" holds what the node's
# terms changed since those the server's totals hold of it, "F.<param>" (F_k) and "G.<param>"
# (F_k * w_k); the train message's "fisher-penalty" then holds the totals as "penalty.<param>"
# and "anchor.<param>", and "included-round" (1,): the round whose terms of this node they hold
FISHER_DELTA = "fisher-delta"
INCLUDED_ROUND = "included-round"

# FedProto: the train message's "feature-prototypes" (from round 2) holds "prototypes" (C, d),
# the global per-class mean features P_G, and "present" (C,) bool, the classes that have one; the
# reply's holds the node's "prototypes" (C, d) float32 and per-class "counts" (C,) int64
FEATURE_PROTOTYPES = "feature-prototypes"

# SCAFFOLD: the train message's "control" holds the server's control variate c, one array per
# trainable parameter name; the reply's "control-delta" holds Delta c_k = c_k+ - c_k, same keys
CONTROL = "control"
CONTROL_DELTA = "control-delta"

# FedCSD's prototype phase: query "query.csd_prototypes" carries the teacher; the reply's
# "prototypes" record holds "prototypes" (C, C) mean teacher logits per class and "counts" (C,)
CSD_PROTOTYPES = "csd_prototypes"

# what CKA selection (DCFL's) needs its strategy to provide: the clients explored so far
EXPLORED_CLIENTS = "explored-clients"

# DCFL (condensed data). Train config key "condense": True asks the node to condense its data
# and reply with it (it is not yet explored), False not to; its presence marks a DCFL round.
CONDENSE = "condense"
# record "condensed": arrays "images" (N, C, H, W) float32 and "labels" (N,) int64; in a train
# message the complementary group's images to fine-tune on, in a reply the node's own set
CONDENSED = "condensed"
# the pre-training request "query.dcfl_condense" (global model w^0 in "arrays"): the node
# condenses, trains E_c epochs and replies "condensed" and "classifier" (array "weight" (C, d))
DCFL_CONDENSE = "dcfl_condense"
CLASSIFIER = "classifier"
CONDENSE_SECONDS = "condense-seconds"  # reply metric: the node's condensation time
# reply metrics: what the node measured of the set it ships (its own data never leaves it):
CONDENSE_EPSILON = "condense-epsilon"  # DP-DM's epsilon (at condense_dp_delta); absent without
CONDENSED_COPIES = "condensed-copies"  # share of images with a near-copy among its real images
CONDENSED_SIMILARITY = "condensed-similarity"  # median correlation with the nearest real image


@dataclass(frozen=True)
class DatasetMeta:
    """The dataset as this federation uses it: what a node needs to read its data alike."""

    classes: list[str]
    shape: list[int]  # (C, H, W)
    mean: list[float]
    std: list[float]
    aux_per_class: int = 0  # training samples per class the server keeps as its aux set

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> DatasetMeta:
        return cls(**json.loads(text))


def model_to_arrays(model: nn.Module) -> ArrayRecord:
    """Parameters and buffers (BatchNorm statistics included) as an ArrayRecord."""
    from flwr.app import ArrayRecord

    return ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})


def load_numpy(model: nn.Module, arrays: dict) -> None:
    """Load NumPy arrays (the strategies' form of a model) into ``model``."""
    import torch

    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()})


def load_arrays(model: nn.Module, arrays: ArrayRecord, record: str = ARRAYS) -> None:
    """Load ``arrays`` into ``model`` once each is checked against the model's own entry:
    the same names, and each array of the entry's dtype and shape (load_state_dict would cast
    an int64 array into a float parameter, and a node would then release it as something the
    server's message, not its model, decided). ConfigError in one line naming ``record``."""
    import torch

    own = model.state_dict()
    names = set(arrays.keys())
    if names != set(own):
        missing, extra = sorted(set(own) - names), sorted(names - set(own))
        raise ConfigError(f"the '{record}' record's arrays are not this model's: "
                          + "; ".join(filter(None, [
                              missing and f"lacks {', '.join(missing[:3])}",
                              extra and f"has no such entry {', '.join(extra[:3])}"]))
                          + ": refused")
    state = {}
    for name, entry in own.items():
        value = arrays[name].numpy()
        wanted = str(entry.dtype).removeprefix("torch.")
        if str(value.dtype) != wanted or tuple(value.shape) != tuple(entry.shape):
            raise ConfigError(f"the '{record}' record holds {name} as {value.dtype} "
                              f"{tuple(value.shape)}; this model has {wanted} "
                              f"{tuple(entry.shape)}: refused")
        state[name] = torch.from_numpy(np.array(value))
    model.load_state_dict(state)


def summed_payload(config) -> tuple[str, list[str]] | None:
    """(the reply record, its arrays) a train message's config names as the round's summed
    payload; None when the release takes no payload as a sum."""
    if SUMMED_PAYLOAD not in config:
        return None
    return str(config[SUMMED_PAYLOAD]), [str(name) for name in config[SUMMED_ARRAYS]]
