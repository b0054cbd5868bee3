"""The per-round row's columns (metrics.csv, metrics.json) that the server writes itself.

A client's reply metric becomes a column of the same row (train-loss -> train_loss, a list
metric -> <name>_0, <name>_1, ...). One that would name a server column is refused with its
reply (``forged_column``), so no client can write the server's own numbers; a strategy's own
measurements (``DriftStrategy.server_columns``) take the place of a client metric of the same
name."""

from __future__ import annotations

SERVER_COLUMNS = frozenset({
    "round", "test_accuracy", "test_loss", "seconds", "train_seconds", "eval_seconds",
    "clients", "model_updated", "rejected", "rejected_partitions", "lost_partitions",
    "late_partitions", "refused_state", "bytes_sent", "bytes_received", "per_class_accuracy",
    "epsilon", "dropped_partitions", "client_acc_before_mean", "client_acc_before_std",
    "client_acc_before_worst10", "client_acc_before_best", "client_acc_after_mean",
    "client_acc_after_std", "client_acc_after_worst10", "client_acc_after_best"})
# flattened families: per_class_accuracy -> acc_class_<i>; every bytes_* count
SERVER_PREFIXES = ("acc_class_", "per_class_accuracy_", "bytes_")
# the bytes of each payload kind (driftfl/server/traffic.py): server -> client, client -> server
BYTES_DOWN, BYTES_UP = "bytes_down_", "bytes_up_"
SURVEY = "survey"  # the data survey's kind, counted in round 0's row


def column(metric: str) -> str:
    """The row column a client metric is recorded under."""
    return metric.replace("-", "_")


def forged_column(metric: str) -> str | None:
    """The server column that client metric ``metric`` would write (None: it writes none);
    checked with a trailing '_' since a list metric becomes <name>_<i> columns."""
    name = column(metric)
    if name in SERVER_COLUMNS or (name + "_").startswith(SERVER_PREFIXES):
        return name
    return None
