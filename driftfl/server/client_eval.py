"""What the run directory keeps per client: every round's clients in clients.csv (examples,
what became of each, and with per-client evaluation each evaluating client's accuracy on its
held-out split before and after local training), and the evaluation's spread across the clients
in the round's row (client_acc_before_mean, ..._std, ..._worst10, ..._best, the same with
after)."""

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


def client_rows(server_round: int, report, updates, clients) -> list[dict]:
    """clients.csv's rows of a round: every client it sent a train message or dropped before
    training, in partition order, with its examples (the data survey's), its ``outcome``
    (accepted, rejected, dropped, lost, late: the round report's) and, where measured, its
    accuracies before and after local training."""
    outcome = {clients.name(u.node_id): "accepted" for u in updates}
    for what, names in (("rejected", report.rejected_partitions), ("dropped", report.dropped),
                        ("lost", report.lost), ("late", report.late)):
        outcome.update(dict.fromkeys(names, what))
    examples = {clients.name(node): count for node, count in (clients.surveyed or {}).items()}
    figures = {f["client"]: f for f in client_figures(server_round, updates, clients.name)}
    return [{"round": server_round, "client": name, "examples": examples.get(name, ""),
             "outcome": outcome[name],
             **{k: v for k, v in figures.get(name, {}).items() if k.startswith("acc_")}}
            for name in sorted(outcome, key=lambda n: (not n.isdigit(), int(n) if n.isdigit()
                                                       else 0, n))]


def spread_columns(figures: list[dict]) -> dict[str, float]:
    """The round's row columns from its clients' figures (none when none evaluated)."""
    row = {}
    for phase in PHASES:
        for stat, value in spread([f[f"acc_{phase}"] for f in figures]).items():
            row[f"client_acc_{phase}_{stat}"] = value
    return row
