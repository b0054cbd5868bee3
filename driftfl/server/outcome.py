"""How a run ended, for summary.json: ``completed`` (every round's model learnt from its clients),
``incomplete`` (some round got no usable reply, or fewer than min_clients were connected at the
end: the model trained, but not as configured) or ``failed`` (no round trained, or the run was
stopped); all but ``completed`` with a ``reason``."""

from __future__ import annotations


def learned(row: dict) -> bool:
    """Whether a round's model learnt from its clients: some reply was usable and the aggregate
    replaced the global model (under DP a round with no usable reply still moves the model, by
    its release's noise alone, and has learnt nothing)."""
    return bool(row["model_updated"]) and row.get("clients", 1) > 0


def run_status(rows: list[dict], *, stopped: str = "", connected: int | None = None,
               min_clients: int = 1, last_rejection: str = "") -> dict[str, str]:
    """``rows``: the metrics rows (round 0 first); ``stopped``: why the run stopped before
    its last round; ``connected``: deployment's clients connected after the last round."""
    if stopped:
        return {"status": "failed", "reason": stopped}
    idle = [r["round"] for r in rows[1:] if not learned(r)]
    if len(idle) == len(rows) - 1:
        return {"status": "failed", "reason": (
            "no round got a usable client reply, so the model never trained"
            + (f"; the last round's first rejection: {last_rejection}" if last_rejection
               else ""))}
    reasons = []
    if idle:
        reasons.append(f"round(s) {' '.join(map(str, idle))} got no usable client reply "
                       "or had their aggregate refused (the global model learnt nothing)")
    if connected is not None and connected < min_clients:
        reasons.append(f"only {connected} clients were connected after the last round, fewer "
                       f"than min_clients={min_clients}")
    if reasons:
        return {"status": "incomplete", "reason": "; ".join(reasons)}
    return {"status": "completed"}
