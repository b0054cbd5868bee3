"""The report's second table: the bytes of each payload kind (the record of a message that held
them: arrays, prototypes, fisher, ...), a row per group and kind, KB per client per round down
(server -> client) and up (client -> server), mean ± std over the runs of each run's mean over
its trained rounds. The data survey, sent once before round 1 (round 0's row), is shown per
client, once."""

from __future__ import annotations

from driftfl.common.columns import BYTES_DOWN, BYTES_UP, SURVEY

from .runs import Run, number
from .table import Group, mean_std

KB = 1 / 1024  # mean_std's scale


def kinds(runs: list[Run]) -> list[str]:
    """The payload kinds any of ``runs`` records, the survey last."""
    found = {key[len(prefix):] for run in runs for row in run.rounds for key in row
             for prefix in (BYTES_DOWN, BYTES_UP) if key.startswith(prefix)}
    return sorted(found, key=lambda kind: (kind == SURVEY, kind))


def recorded(run: Run) -> bool:
    """Whether ``run`` counts bytes by kind (a run of an earlier driftfl only in all)."""
    return any(key.startswith((BYTES_DOWN, BYTES_UP)) for row in run.rounds for key in row)


def per_client(run: Run, prefix: str, kind: str) -> float:
    """The bytes of ``kind`` per client (``prefix``: down or up): a mean over the trained
    rounds (a round that did not send the kind sent 0 bytes of it); the survey's once."""
    column = prefix + kind
    if kind == SURVEY:
        before = [r.get(column, 0) for r in run.rounds if r["round"] == 0]
        clients = run.value("num_clients")
        return sum(before) / clients if number(clients) and clients > 0 else 0.0
    rows = [r for r in run.trained if number(r.get("clients"))]
    if not rows:
        return 0.0
    return sum(r.get(column, 0) / max(r["clients"], 1) for r in rows) / len(rows)


def payload_table(groups: list[Group], by: list[str]) -> tuple[list[str], list[list], list[str]]:
    """The header, a row per group and payload kind it sent, and notes on what is missing."""
    header = [*by, "payload", "KB / client / round down", "KB / client / round up"]
    rows, older = [], []
    for group in groups:
        runs = [run for run in group.runs if recorded(run)]
        if len(runs) < len(group.runs):
            older.append(group.title)
        for kind in kinds(runs):
            down = [per_client(run, BYTES_DOWN, kind) for run in runs]
            up = [per_client(run, BYTES_UP, kind) for run in runs]
            if any(down) or any(up):
                name = f"{kind} (once, before round 1)" if kind == SURVEY else kind
                rows.append([*group.name, name, mean_std(down, KB), mean_std(up, KB)])
    notes = [f"bytes by payload kind: {len(older)} row(s) hold runs that count bytes only in all "
             f"(an earlier driftfl), left out of the payload table: {', '.join(older)}"
             ] if older and rows else []
    return header, rows, notes
