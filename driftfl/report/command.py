"""`driftfl report`: many run directories -> a mean +- std table and accuracy-versus-round plot.

    driftfl report multirun/2026-11-22/10-00-00 [more dirs] [--by label] [--target fedavg]

Runs are grouped by config keys (``--by``, default ``label``, which experiments set); runs in
one row agree on every experiment setting but the seed and the operational ones (where a label's
runs differ, say in rounds, each setting gets its own row, e.g. ``fedavg (rounds=2)``, and a
line names the keys). Each row gets the mean +- std over its runs of the final and best test
accuracy, the rounds its runs took to first reach the mean final accuracy of its target row,
seconds per round (from round 2) and of the runs' start-up, and bytes per client per round; ``--metrics`` adds the mean over trained rounds of any per-round diagnostic
(logit_shift, mask_filter_rate, teacher_accuracy, ...). The target row (``--target``, e.g.
fedavg) is the one that differs only in the last ``--by`` key: with ``--by
partition.name,label`` each partition races to its own FedAvg. Writes report.md, report.csv
and report.png beside printing the table.

The run directories may be someone else's: their files are read only as regular files within a
cap (runs.py), no output is written through a symbolic link (one is refused before anything is
written; each file is written anew and renamed into place), and a CSV cell a spreadsheet would
run as a formula is quoted.

This module: the options, checked before anything is written, and what it writes.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

from driftfl.common.untrusted import UnsafeFile, refuse_links, replaced, replaced_path, write_text

from . import clients
from .payloads import payload_table
from .plot import plot
from .runs import Run, find_runs, flatten, numbers
from .table import group_runs, markdown, split_notes, summarise


OUTPUTS = ("report.md", "report.csv", "payloads.csv", "report.png", "clients.png")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def fail(message: str) -> NoReturn:
    print(f"driftfl report: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def names(text: str | None, option: str, example: str) -> list[str] | None:
    """A comma-separated option as a list (None where it was not given); empty: refused."""
    if text is None:
        return None
    found = [name.strip() for name in text.split(",") if name.strip()]
    if not found:
        fail(f"{option} is empty; give comma-separated names, e.g. {option} {example}")
    return found


def check_by(runs: list[Run], by: list[str]) -> None:
    """Each ``--by`` key must be a setting (or section) of some run's config.yaml."""
    known = {".".join(key.split(".")[:i]) for run in runs for key in flatten(run.config)
             for i in range(1, key.count(".") + 2)}
    for key in by:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=5, cutoff=0.6)
            fail(f"--by {key}: no run's config.yaml has this setting; "
                 + (f"close ones: {', '.join(close)}" if close else
                    f"the settings are {', '.join(sorted(k for k in known if '.' not in k))} "
                    "(a section's keys as section.key, e.g. partition.name)"))


def check_labels(values: list[str], key: str, target: str | None,
                 only: list[str] | None) -> set[str] | None:
    """``--target`` must be a value of the last ``--by`` key; ``--only`` values no run has are
    named (refused where none is left). Returns the values to show (None: all)."""
    valid = ", ".join(values)
    if target is not None and target not in values:
        fail(f"--target {target}: no run has {key} {target}; valid: {valid}")
    if only is None:
        return None
    if absent := [name for name in only if name not in values]:
        if len(absent) == len(only):
            fail(f"--only: no run has {key} {', '.join(absent)}; valid: {valid}")
        print(f"driftfl report: warning: --only: no run has {key} {', '.join(absent)}; "
              f"valid: {valid}", file=sys.stderr)
    return set(only)


def linked_part(out: Path) -> Path | None:
    """The first symbolic link among ``out`` and the folders its name spells above it (a
    relative name's; an absolute name's: ``out`` alone, since a link higher up, a cluster's
    /home, is the system's, not the report's to refuse)."""
    parts = [*reversed(out.parents), out] if not out.is_absolute() else [out]
    return next((p for p in parts if p != Path(".") and p.is_symlink()), None)


def writable(out: Path) -> None:
    """Creates ``out`` and writes a file there and takes it back, or refuses in one line: a
    report is never written through a link (one to a folder would put it wherever the link's
    maker chose)."""
    if link := linked_part(out):
        fail(f"--out {out}: {link} is a symbolic link; driftfl never writes through one "
             "(name the folder itself, or choose another --out)")
    if out.exists() and not out.is_dir():
        fail(f"--out {out} is a file; name a directory for report.md, .csv and .png")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        fail(f"cannot write the report to {out} ({err.strerror or err}); choose another --out")


def cell(value):
    """A CSV cell a spreadsheet shows as text: one starting with = + - @ (or a tab or a carriage
    return) would be run as a formula (a run's label is anyone's text), so it gets a leading
    single quote (OWASP's rule); a plain number, negative ones too, stays as it is."""
    if isinstance(value, str) and value[:1] in FORMULA_START:
        try:
            float(value)
        except ValueError:
            return "'" + value
    return value


def write_csv(path: Path, rows: list[list]) -> None:
    with replaced(path, newline="") as f:
        csv.writer(f).writerows([[cell(v) for v in row] for row in rows])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="driftfl report",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run or sweep directories")
    parser.add_argument("--by", default="label",
                        help="comma-separated config keys to group by (default: label)")
    parser.add_argument("--target", default=None,
                        help="a group whose mean final accuracy the others race to, e.g. fedavg")
    parser.add_argument("--only", default=None,
                        help="comma-separated values of the last --by key to show, e.g. "
                             "fedavg,fedcsd")
    parser.add_argument("--metrics", default="",
                        help="comma-separated per-round diagnostics to average, e.g. "
                             "logit_shift,mask_filter_rate")
    parser.add_argument("--out", type=Path, default=None,
                        help="where report.md/.csv/.png go (default: the first path)")
    args = parser.parse_args(argv)
    by = names(args.by, "--by", "partition.name,label")
    only = names(args.only, "--only", "fedavg,fedcsd")
    metrics = tuple(names(args.metrics, "--metrics", "logit_shift") if args.metrics else ())
    if missing := [str(p) for p in args.paths if not p.exists()]:
        fail(f"no such directory: {', '.join(missing)}")
    try:
        runs, unfinished = find_runs(args.paths)
    except UnsafeFile as err:
        fail(str(err))
    if not runs:
        fail(f"no completed run with a trained round (metrics.json + summary.json) under "
             f"{', '.join(str(p) for p in args.paths)}")
    check_by(runs, by)
    keep = check_labels(sorted({str(r.value(by[-1])) for r in runs}), by[-1], args.target, only)
    recorded = {k for r in runs for row in r.trained for k in row if numbers([row], k)}
    if unknown := [m for m in metrics if m not in recorded]:
        fail(f"no run records {', '.join(unknown)}; the runs record {', '.join(sorted(recorded))}")
    out = args.out or args.paths[0]
    writable(out)
    try:
        refuse_links(*(out / name for name in OUTPUTS))
    except UnsafeFile as err:
        fail(str(err))

    groups = group_runs(runs, by)
    shown = [g for g in groups if keep is None or g.key[-1] in keep]
    header, rows, missing_notes = summarise(shown, groups, by, args.target, metrics)
    payload_header, payload_rows, older_notes = payload_table(shown, by)
    table = markdown(header, rows)
    if payload_rows:  # the bytes of each payload kind, below the main table
        table += "\n\n" + markdown(payload_header, payload_rows)
    notes = split_notes(shown, by) + missing_notes + older_notes
    try:
        write_text(out / "report.md", "\n\n".join([table, *notes]) + "\n")
        write_csv(out / "report.csv", [header, *rows])
        if payload_rows:
            write_csv(out / "payloads.csv", [payload_header, *payload_rows])
        with replaced_path(out / "report.png") as png:
            plot(shown, png, by)
        if clients.recorded(shown):  # per-client evaluation: who is left behind, per round
            with replaced_path(out / "clients.png") as png:
                clients.plot_spread(shown, png)
    except OSError as err:
        fail(f"cannot write the report to {out} ({err.strerror or err}); choose another --out")
    print(table + "".join(f"\n{note}" if i else f"\n\n{note}" for i, note in enumerate(notes)))
    if unfinished:
        print(f"\n{len(unfinished)} run(s) did not complete and are left out: "
              + ", ".join(str(p) for p in unfinished[:5]))
    print(f"\nwritten: {out / 'report.md'}, report.csv, "
          f"{'payloads.csv, ' if payload_rows else ''}report.png"
          f"{', clients.png' if clients.recorded(shown) else ''}")
