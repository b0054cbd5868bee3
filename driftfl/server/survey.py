"""The data survey: before the first round every node says which partition it is and how much
of each class it holds. Nothing in a reply is trusted: a malformed summary or a second claim on
a partition refuses that node (logged, never sampled), and the run goes on with the others.
With an owners file (node authentication: a node id stands for a registered key) a node may
claim only the partition its key was given, and no more examples than declared for it; without
one, the first node to claim a partition keeps it.

Nodes are asked in batches, with a progress line when there are many. (In simulation there is
no survey: the server assigns the partitions, see simulated.py.)
"""

from __future__ import annotations

import re
import time
from logging import WARNING

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.supercore import log

from driftfl.common.error_replies import error_reason
from driftfl.common.errors import ConfigError
from driftfl.common.owners import MAX_EXAMPLES, OWN_DATA, Owner, partition_name
from driftfl.common.protocol import (CONFIG, DATA_SUMMARY, DATASET_META, LABEL_HISTOGRAM,
                                     METRICS, NUM_EXAMPLES, PARTITION_ID, DatasetMeta)
from .nodes import wait_for_nodes

BATCH = 1000  # nodes asked at once: bounds the messages in flight and paces the progress line


def survey_clients(grid: Grid, experiment_record: ConfigRecord, expected: int,
                   node_wait: float, timeout: float,
                   owners: dict[int, Owner] | None = None) -> list[dict]:
    """Each accepted node's node_id, partition_id, num_examples and label_histogram, by
    partition. A node that cannot read its data fails the run here, with its reason.
    ``owners``: node id -> what its key holds (the owners file), None: first claimant."""
    nodes = wait_for_nodes(grid, expected, timeout=node_wait)
    replies, started = [], time.monotonic()
    for first in range(0, len(nodes), BATCH):
        batch = nodes[first:first + BATCH]
        answers = ask_summaries(grid, experiment_record, batch, timeout)
        failures = [f"{node_name(r.metadata.src_node_id)}: {error_text(r.error.reason)}"
                    for r in answers if r.has_error()]
        if failures:
            raise ConfigError(f"{len(failures)} of {len(batch)} nodes cannot read their data "
                              f"({'; '.join(failures)}); each SuperNode's log has the full "
                              "reason: fix its --node-config and start it again")
        if len(answers) < len(batch):
            silent = sorted(set(batch) - {r.metadata.src_node_id for r in answers})
            raise ConfigError(f"node(s) {', '.join(map(str, silent))} did not answer the data "
                              f"survey in {timeout:.0f} s (round_timeout)")
        replies += answers
        if len(nodes) > BATCH:
            print(f"data survey: {len(replies)} of {len(nodes)} nodes answered "
                  f"({time.monotonic() - started:.0f} s)", flush=True)
    clients = admit(replies, experiment_record, expected, claimed={}, owners=owners)
    if not clients:
        raise ConfigError("no node gave a usable data summary; see the warnings above")
    return clients


def error_text(reason: str) -> str:
    """The error's own words from Flower's "<class '...'>:<'words'>" error reason."""
    found = re.fullmatch(r"<class '[\w.]+'>:<'(.*)'>", reason, re.DOTALL)
    return found.group(1) if found else reason


def node_name(node: int) -> str:
    """A node as the operator finds it in `flwr supernode list`; the SuperLink answers in the
    name of a node it lost."""
    return "a node the SuperLink lost" if node == SUPERLINK_NODE_ID else f"node {node}"


def ask_summaries(grid: Grid, experiment_record: ConfigRecord, nodes: list[int],
                  timeout: float) -> list[Message]:
    """The nodes' replies to the data-summary query (error replies included)."""
    query = [Message(RecordDict({CONFIG: experiment_record}), dst_node_id=node,
                     message_type=f"{MessageType.QUERY}.{DATA_SUMMARY}") for node in nodes]
    return list(grid.send_and_receive(query, timeout=timeout))


def admit(replies: list[Message], experiment_record: ConfigRecord, expected: int,
          claimed: dict[int, int], owners: dict[int, Owner] | None = None) -> list[dict]:
    """The clients whose summaries can be used, by partition. ``claimed`` (partition id ->
    node id, updated here) holds the partitions already taken: in arrival order, the first
    to claim a partition keeps it. ``owners`` (node id -> Owner), when given, also binds each
    node to its key's partition and declared count."""
    num_classes = len(DatasetMeta.from_json(str(experiment_record[DATASET_META])).classes)
    clients = []
    for reply in replies:
        node = reply.metadata.src_node_id
        summary = (error_reason(reply.error) if reply.has_error()
                   else check_summary(reply, num_classes, expected))
        if isinstance(summary, dict) and owners is not None:
            summary = owner_problem(summary, owners.get(node)) or summary
        if isinstance(summary, dict) and summary["partition_id"] in claimed:
            summary = (f"claims partition {summary['partition_id']}, which node "
                       f"{claimed[summary['partition_id']]} holds")
        if isinstance(summary, str):
            log(WARNING, "data survey: node %s refused: %s", node, summary)
            continue
        if summary["partition_id"] != OWN_DATA:
            claimed[summary["partition_id"]] = node
        clients.append({"node_id": node, **summary})
    return sorted(clients, key=lambda c: (c["partition_id"], c["node_id"]))


def check_summary(reply: Message, num_classes: int, num_partitions: int) -> dict | str:
    """{partition_id, num_examples, label_histogram}, or why this summary cannot be used."""
    if METRICS not in reply.content.metric_records:
        return f"its summary lacks the '{METRICS}' record"
    metrics = reply.content.metric_records[METRICS]
    partition, n = metrics.get(PARTITION_ID), metrics.get(NUM_EXAMPLES)
    histogram = metrics.get(LABEL_HISTOGRAM)
    if not isinstance(partition, int) or not OWN_DATA <= partition < num_partitions:
        return (f"'{PARTITION_ID}' is {partition!r}; expected {OWN_DATA} (own data) or "
                f"0..{num_partitions - 1}")
    if not isinstance(n, int) or not 1 <= n <= MAX_EXAMPLES:
        return f"'{NUM_EXAMPLES}' is {n!r}; expected a count from 1 to {MAX_EXAMPLES:.0e}"
    if (not isinstance(histogram, list) or len(histogram) != num_classes
            or not all(isinstance(h, int) and h >= 0 for h in histogram)):
        return f"'{LABEL_HISTOGRAM}' is not {num_classes} non-negative counts"
    if sum(histogram) != n:
        return f"its label histogram sums to {sum(histogram)}, not to its {n} examples"
    return {"partition_id": partition, "num_examples": n, "label_histogram": histogram}


def owner_problem(summary: dict, owner: Owner | None) -> str | None:
    """Why the owners file forbids this node's summary (None: it allows it)."""
    claim = partition_name(summary["partition_id"])
    if owner is None:
        return (f"claims {claim}, but its node id has no entry in the owners file (a key "
                "registered without `driftfl secure register`?)")
    if summary["partition_id"] != owner.partition:
        held = "own" if summary["partition_id"] == OWN_DATA else summary["partition_id"]
        return (f"claims {claim}; the owners file gives its key {owner.key} "
                f"{partition_name(owner.partition)}: if the node holds that, register its key "
                f"again with `driftfl secure register --partition {owner.key}={held}`"
                + (" (a node reading files of its own, as `driftfl split` writes them)"
                   if held == "own" else ""))
    if owner.num_examples is not None and summary["num_examples"] > owner.num_examples:
        return (f"claims {summary['num_examples']} examples; the owners file declares "
                f"{owner.num_examples} for its key {owner.key}")
    return None
