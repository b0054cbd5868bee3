"""The per-round row's columns (metrics.csv, metrics.json) that the server writes itself.

A client's reply metric becomes a column of the same row (train-loss -> train_loss, a list
metric -> <name>_0, <name>_1, ...). Its name must be plain (``metric_name_problem``: ASCII, of
lowercase letters, digits, - and _) and, compared as ``folded``, name no column the server or
any strategy writes (``forged_column``): such a reply is refused, so no client can write the
server's own numbers nor a near-miss of them (Test-Accuracy, a Cyrillic e, a zero-width
suffix); a strategy's own measurements (``DriftStrategy.server_columns``) take the place of a
client metric of the same name."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

SERVER_COLUMNS = frozenset({
    "round", "test_accuracy", "test_loss", "seconds", "train_seconds", "eval_seconds",
    "clients", "model_updated", "rejected", "rejected_partitions", "lost_partitions",
    "late_partitions", "failed_partitions", "failed_for", "refused_state", "bytes_sent", "bytes_received", "per_class_accuracy",
    "epsilon", "dropped_partitions", "client_acc_before_mean", "client_acc_before_std",
    "client_acc_before_worst10", "client_acc_before_best", "client_acc_after_mean",
    "client_acc_after_std", "client_acc_after_worst10", "client_acc_after_best"})
# flattened families: per_class_accuracy -> acc_class_<i>; every bytes_* count; the privacy
# release's columns (dp_q, dp_sigma, dp_clip, dp_update_norm, ...: strategies/parts/release)
SERVER_PREFIXES = ("acc_class_", "per_class_accuracy_", "bytes_", "dp_")
# a client metric's name: as every client here names its own (train-loss, control-norm,
# condense-seconds), bounded so that a name cannot fill a row
METRIC_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")
# the largest magnitude a client metric may have. Honest ones are losses, accuracies, norms
# and counts (at most owners.MAX_EXAMPLES, 1e8), far below; what the server does with them
# (weighted sums and means over up to 1e6 clients, squares for a spread) then stays finite
# and exact, where 1.7e308 overflowed the first sum to inf
MAX_METRIC = 1e12
# the bytes of each payload kind (driftfl/server/traffic.py): server -> client, client -> server
BYTES_DOWN, BYTES_UP = "bytes_down_", "bytes_up_"
SURVEY = "survey"  # the data survey's kind, counted in round 0's row


def column(metric: str) -> str:
    """The row column a client metric is recorded under."""
    return metric.replace("-", "_")


def folded(name: str) -> str:
    """``name`` as columns are compared: NFKC, casefolded, '-' as '_', a run of separators as
    one and none at either end (test-accuracy, Test_Accuracy and test__accuracy_ are one)."""
    name = unicodedata.normalize("NFKC", name).casefold().replace("-", "_")
    return re.sub("_+", "_", name).strip("_")


def forged_column(metric: str, written: Iterable[str] = ()) -> str | None:
    """The column, the server's own or one of ``written`` (those strategies write), that client
    metric ``metric`` would write or be taken for (None: none), compared ``folded``; the
    server's families are checked with a trailing '_' since a list metric becomes <name>_<i>
    columns."""
    name = folded(metric)
    for own in (*SERVER_COLUMNS, *written):
        if folded(own) == name:
            return own
    if (name + "_").startswith(SERVER_PREFIXES):
        return column(metric)
    return None


def metric_name_problem(metric: str, written: Iterable[str] = ()) -> str | None:
    """Why a client may not send a metric of this name (None: it may): not ASCII, not of
    METRIC_NAME's shape, or a column the server or a strategy writes (``forged_column``)."""
    if not metric.isascii():
        return f"metric {ascii(metric)} is not named in ASCII"
    if not METRIC_NAME.fullmatch(metric):
        return (f"metric {ascii(metric)} is not a name of lowercase letters, digits, - and _ "
                "(a letter first, at most 64)")
    forged = forged_column(metric, written)
    if forged and forged in written:
        return f"metric '{metric}' would pass for '{forged}', a column a strategy writes"
    if forged:
        return f"metric '{metric}' would write the server's own column '{forged}'"
    return None


def plottable(value) -> bool:
    """A column value a tracker plots: an int or float (a bool is neither here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
