"""Per-client evaluation in the run directory: each evaluating client's accuracy on its
held-out split before and after local training (clients.csv), and their spread across the
clients in the round's row (client_acc_before_mean, ..._std, ..._worst10, ..._best, the same
with after)."""

from __future__ import annotations

from driftfl.common.client_split import ACC_AFTER, ACC_BEFORE, spread

PHASES = {"before": ACC_BEFORE, "after": ACC_AFTER}
# the row's columns, in order (driftfl.common.columns lists them as the server's own)
COLUMNS = tuple(f"client_acc_{phase}_{stat}" for phase in PHASES
                for stat in ("mean", "std", "worst10", "best"))


def client_figures(server_round: int, updates, name_of) -> list[dict]:
    """One row per accepted reply that carries the figures: round, client, before, after."""
    return [{"round": server_round, "client": name_of(u.node_id),
             "acc_before": u.metrics[ACC_BEFORE], "acc_after": u.metrics[ACC_AFTER]}
            for u in updates if ACC_BEFORE in u.metrics and ACC_AFTER in u.metrics]


def spread_columns(figures: list[dict]) -> dict[str, float]:
    """The round's row columns from its clients' figures (none when none evaluated)."""
    row = {}
    for phase in PHASES:
        for stat, value in spread([f[f"acc_{phase}"] for f in figures]).items():
            row[f"client_acc_{phase}_{stat}"] = value
    return row
