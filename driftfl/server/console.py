"""What a run prints: the clients' data, one line per round, a closing summary."""

from __future__ import annotations

MAX_ROWS = 20
# The last line a completed run prints: `driftfl run` stops following Flower after it
RESULTS = "results: "
MAX_CLASS_COLUMNS = 12


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def duration(seconds: float) -> str:
    minutes, sec = divmod(seconds, 60)
    return f"{int(minutes)} min {sec:.0f} s" if minutes else f"{sec:.1f} s"


def partition_table(clients: list[dict], classes: list[str], title: str) -> str:
    """Per-client sample counts: the full label histogram when it fits, else the top classes."""
    total = sum(c["num_examples"] for c in clients)
    lines = [f"clients' data ({title}): {len(clients)} clients, {total} samples"]
    wide = len(classes) > MAX_CLASS_COLUMNS
    header = f"{'client':>6} {'n':>7} " + (
        f"{'classes':>7}  largest classes (share)" if wide
        else " ".join(f"{i:>5}" for i in range(len(classes))))
    lines.append(header)
    for c in clients[:MAX_ROWS]:
        hist = c["label_histogram"]
        who = c["partition_id"] if c["partition_id"] >= 0 else "own"
        if wide:
            top = sorted(range(len(hist)), key=lambda i: -hist[i])[:3]
            held = sum(1 for h in hist if h)
            desc = ", ".join(f"{i} ({hist[i] / max(c['num_examples'], 1):.0%})"
                             for i in top if hist[i])
            lines.append(f"{who:>6} {c['num_examples']:>7} {held:>7}  {desc}")
        else:
            lines.append(f"{who:>6} {c['num_examples']:>7} " + " ".join(f"{h:>5}" for h in hist))
    if len(clients) > MAX_ROWS:
        lines.append(f"   ... {len(clients) - MAX_ROWS} more clients in partition.json")
        lines.append(_spread("samples", [c["num_examples"] for c in clients]) + "; " + _spread(
            "classes", [sum(1 for h in c["label_histogram"] if h) for c in clients]))
    return "\n".join(lines)


def coverage_gaps(clients: list[dict], classes: list[str]) -> dict[str, list]:
    """What the partition leaves uncovered: classes no client trains on (their test samples can
    never be learnt, which caps the accuracy the run can reach) and clients with no sample."""
    totals = [sum(c["label_histogram"][i] for c in clients) for i in range(len(classes))]
    return {"classes_without_client": [i for i, n in enumerate(totals) if not n],
            "clients_without_sample": [c["partition_id"] for c in clients
                                       if not c["num_examples"]]}


def coverage_warning(gaps: dict[str, list], classes: list[str], partition: str) -> str:
    """One line for what ``coverage_gaps`` found, or "" when every class and client has data."""
    said = []
    if missing := gaps["classes_without_client"]:
        said.append(f"class(es) {', '.join(f'{i} ({classes[i]})' for i in missing)} held by "
                    "no client: the global model never sees them, and test accuracy on them "
                    "stays 0")
    if empty := gaps["clients_without_sample"]:
        said.append(f"client(s) {' '.join(map(str, empty))} hold no sample")
    if not said:
        return ""
    fix = {"pathological": "partition.assignment=covering with num_clients x "
                           "classes_per_client >= classes covers every class",
           "dirichlet": "a larger partition.min_size gives every client data"}.get(
               partition, "use fewer clients or more data")
    return f"driftfl: warning: the partition leaves {'; '.join(said)} ({fix})"


def _spread(what: str, values: list[int]) -> str:
    """min / median / max of a per-client count, for a table too long to print."""
    ordered = sorted(values)
    return (f"{what} per client: min {ordered[0]}, median {ordered[len(ordered) // 2]}, "
            f"max {ordered[-1]}")


def round_line(row: dict, rounds: int, *, secure: bool = False, dp: str = "",
               left: float | None = None) -> str:
    """The round's line; ``secure``: SecAgg+ summed the replies, ``dp``: the privacy mode
    ("central", "distributed"; "": none); ``left``: the estimated seconds of the rounds to
    come (time_left)."""
    text = (f"round {row['round']:>3}/{rounds}  test acc {100 * row['test_accuracy']:6.2f}%  "
            f"loss {row['test_loss']:.4f}  |  train {row['train_seconds']:.1f} s  "
            f"eval {row['eval_seconds']:.1f} s")
    if left is not None:
        text += f"  (about {duration(left)} left)"
    if row["round"] > 0:
        text += (f"  |  {'secagg+ ' if secure else ''}{row['clients']} clients, "
                 f"{_size(row['bytes_sent'])} out, {_size(row['bytes_received'])} in")
        failed = str(row.get("failed_partitions") or "").split()
        rejected = [p for p in str(row.get("rejected_partitions") or "").split()
                    if p not in failed]
        if row.get("rejected") and rejected:
            text += f", {len(rejected)} rejected (partitions {' '.join(rejected)})"
        if failed:
            text += f", failed ({row['failed_for']}): partition(s) {' '.join(failed)}"
        if row.get("dropped_partitions"):
            text += f", dropped: partition(s) {row['dropped_partitions']}"
        if row.get("lost_partitions"):
            text += f", lost: partition(s) {row['lost_partitions']}"
        if row.get("late_partitions"):
            text += f", late: partition(s) {row['late_partitions']}"
        if row.get("refused_state"):
            text += f", state kept ({row['refused_state']})"
        if row.get("secagg_outcome") and row["model_updated"]:
            text += f", {row['secagg_outcome']}"
        if not row["model_updated"] and row.get("secagg_outcome"):  # SecAgg+ said why
            text += f"  |  {row['secagg_outcome']}: the global model stays"
        elif not row["clients"]:
            text += ("  |  no usable reply: the model moved by the release's noise alone"
                     if row["model_updated"] else "  |  no usable reply: the global model stays")
        elif not row["model_updated"]:
            text += "  |  the aggregate was refused: the global model stays"
    if "epsilon" in row:  # differential privacy: spent so far, at the run's delta
        text += f"  |  {'DP ' + dp + ', ' if dp else ''}epsilon {row['epsilon']:.3g}"
        text += _dp_figures(row)
    return text


def time_left(rows: list[dict], rounds: int) -> float | None:
    """The rounds to come times the mean of the rounds trained so far (round 0, the start,
    apart), once a round is trained and while rounds remain; None otherwise."""
    trained = [r["seconds"] for r in rows if r["round"] > 0]
    if not trained or rows[-1]["round"] >= rounds:
        return None
    return (rounds - rows[-1]["round"]) * sum(trained) / len(trained)


def _dp_figures(row: dict) -> str:
    """Why a DP round learnt or not: the released update's norm against its noise's alone
    (covered by epsilon); under central the exact norms the trusted server saw (not covered)."""
    if "dp_update_norm" not in row:
        return ""  # nothing was released
    text = (f": update norm {row['dp_update_norm']:.3g} (its noise alone "
            f"{row['dp_noise_norm']:.3g})")
    if "dp_clipped_share" in row and row["dp_clipped_share"] == row["dp_clipped_share"]:
        text += (f"; {100 * row['dp_clipped_share']:.0f}% clipped, median norm "
                 f"{row['dp_median_norm']:.3g} (exact, not covered by epsilon)")
    return text


def protection_note(label: str, summary: dict) -> str:
    """What protected the run, for accuracy.png: the release's ``label`` ("DP central",
    "secagg+", ...) with the epsilon spent at its delta where DP was on ("": unprotected)."""
    if "delta" not in summary:
        return {"secagg+": "secure aggregation: SecAgg+"}.get(label, label)
    epsilon = summary.get("epsilon")
    spent = f"{epsilon:.3g}" if epsilon is not None else "inf"
    return f"{label}: epsilon {spent} at delta {summary['delta']:g}"


def summary_line(summary: dict, run_dir) -> str:
    incomplete = (f"driftfl: the run is {summary['status']}: {summary['reason']}\n"
                  if summary.get("reason") else "")
    rounds = summary.get("rounds_run", summary["rounds"])  # a privacy budget may stop it early
    return incomplete + (f"driftfl: {timing(summary, rounds)}; final test "
            f"accuracy {100 * summary['final_accuracy']:.2f}% (best "
            f"{100 * summary['best_accuracy']:.2f}% at round {summary['best_round']})\n"
            f"{RESULTS}{run_dir} ({', '.join(shown_files(run_dir))})")


# what the closing line points to, where the run wrote it
SHOWN = ("metrics.csv", "accuracy.png", "per_class.png", "partition.png", "clients.png",
         "model.pt")


def shown_files(run_dir) -> list[str]:
    from pathlib import Path

    return [name for name in SHOWN if (Path(run_dir) / name).is_file()]


def timing(summary: dict, rounds: int) -> str:
    """'5 rounds in 12.0 s after a 40.1 s start-up', and a resumed run's earlier parts apart:
    'rounds 4-5 in ... (rounds 1-3: 9.2 s before the resume)'."""
    def span(first: int, last: int) -> str:
        return f"round {last}" if first == last else f"rounds {first}-{last}"

    after = summary.get("resumed_after_round")
    done = span(after + 1, rounds) if after else f"{rounds} round{'s' * (rounds != 1)}"
    text = (f"{done} in {duration(summary['seconds'])} after a "
            f"{duration(summary['startup_seconds'])} start-up")
    if after:
        text += (f" ({span(1, after)}: {duration(summary['seconds_before_resume'])} before "
                 "the resume)")
    return text
