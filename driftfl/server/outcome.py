"""How a run ended, for summary.json: ``completed`` (every round's model learnt from its clients),
``incomplete`` (some round got no usable reply, or fewer than min_clients were connected at the
end: the model trained, but not as configured) or ``failed`` (no round trained, or the run was
stopped: after ``max_rounds_without_reply`` rounds in a row without a usable reply, say);
all but ``completed`` with a ``reason``."""

from __future__ import annotations

from driftfl.common.error_replies import change_for


class RunStopped(Exception):
    """The run cannot go on (its message says why and what to change)."""


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
        return {"status": "failed", "reason": "; ".join(filter(None, [
            "no round got a usable client reply, so the model never trained",
            why_none(rows[-1], last_rejection)]))}
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


def without_reply(rows: list[dict]) -> list[int]:
    """The rounds that end ``rows``, in a row, that asked clients and got no usable reply: each
    reply rejected, late or lost. A round that asked none (differential privacy's sample may
    be empty, heterogeneity may drop every client) ends the row."""
    ended = []
    for row in reversed(rows[1:]):
        asked = row.get("rejected") or row.get("late_partitions") or row.get("lost_partitions")
        if row.get("clients", 1) or not asked:
            break
        ended.insert(0, row["round"])
    return ended


def stop_reason(rows: list[dict], limit: int, last_rejection: str = "") -> str:
    """Why the run stops after its last row ("": it goes on): its last ``limit`` rounds got no
    usable client reply (``max_rounds_without_reply``; 0: never stop)."""
    ended = without_reply(rows)
    if not limit or len(ended) < limit:
        return ""
    return "; ".join(filter(None, [
        f"stopped after round {ended[-1]}: rounds {ended[-limit]}-{ended[-1]} got no usable "
        f"client reply (max_rounds_without_reply={limit})", why_none(rows[-1], last_rejection)]))


def telling(rejections: list[str]) -> str:
    """The rejection that tells most of a round: the first for want of a resource (it says
    what to change), else the first ("" when none)."""
    return next((r for r in rejections if change_for(r)), rejections[0] if rejections else "")


def why_none(row: dict, rejection: str) -> str:
    """Why a round got no usable reply (``rejection``: ``telling``'s), with what to change
    when a resource ran out; "" when its row does not tell."""
    if change := change_for(rejection):
        return change
    if rejection:
        return f"the last round's first rejection: {rejection}"
    late, lost = row.get("late_partitions"), row.get("lost_partitions")
    return "; ".join(filter(None, [
        late and f"partition(s) {late} sent nothing back within round_timeout",
        lost and f"partition(s) {lost} were lost"]))
