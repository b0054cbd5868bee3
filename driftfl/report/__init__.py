"""`driftfl report`: many run directories -> a mean +- std table and accuracy-versus-round plot.

    driftfl report multirun/2026-11-22/10-00-00 [more dirs] [--by label] [--target fedavg]

Runs are grouped by config keys (``--by``, default ``label``, which experiments set); runs in
one row agree on every experiment setting but the seed and the operational ones (where a label's
runs differ, say in rounds, each setting gets its own row, e.g. ``fedavg (rounds=2)``, and a
line names the keys). Each row gets the mean +- std over its runs of the final and best test
accuracy, the rounds its runs took to first reach the mean final accuracy of its target row,
seconds per round (from round 2, and round 1 with its start-up apart) and bytes per client per
round; ``--metrics`` adds the mean over trained rounds of any per-round diagnostic
(logit_shift, mask_filter_rate, teacher_accuracy, ...). The target row (``--target``, e.g.
fedavg) is the one that differs only in the last ``--by`` key: with ``--by
partition.name,label`` each partition races to its own FedAvg. Writes report.md, report.csv
and report.png beside printing the table.
"""

from .command import main
from .runs import Run, find_runs
from .table import mean_std

__all__ = ["Run", "find_runs", "main", "mean_std"]
