"""What `driftfl evaluate` says: the console table, the JSON document, where it goes, and the
notes on what the numbers mean (a client share that is no held-out share, ...)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

from driftfl.common.errors import ConfigError
from driftfl.common.paths import cannot_write
from driftfl.common.untrusted import UnsafeFile, refuse_links
from driftfl.common.json_values import json_safe

SHOWN_CLIENTS = 40  # rows of the console's client table; the JSON holds every client
LONGEST_NAME = 80  # characters of the overrides in a default file name, then a digest


def default_out(folder: Path, overrides: list[str]) -> Path:
    """evaluation.json in ``folder`` (a run directory, or the model file's folder); with
    overrides, evaluation-<overrides>.json, so that evaluations on other data sit side by side."""
    if not overrides:
        return folder / "evaluation.json"
    name = re.sub(r"[^A-Za-z0-9._=,+~-]", "_", ",".join(overrides))
    if len(name) > LONGEST_NAME:
        digest = hashlib.sha256(",".join(overrides).encode()).hexdigest()[:8]
        name = f"{name[:LONGEST_NAME]}-{digest}"
    return folder / f"evaluation-{name}.json"


def check_writable(out: Path) -> None:
    """ConfigError, before anything is measured or written, where ``out`` cannot be written: a
    symbolic link (never written through), a folder, a place that cannot be created."""
    try:
        refuse_links(out)
    except UnsafeFile as err:
        raise ConfigError(str(err)) from None
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; name the JSON file to write, e.g. "
                          f"--out {out / 'evaluation.json'}")
    if reason := cannot_write(out.parent):
        raise ConfigError(f"cannot write {out}: {reason}; choose another place with --out "
                          "FILE.json")


def notes(cfg, saved: dict | None) -> list[str]:
    """What a reader of the client figures should know: why there are none, or that the shares
    are not those the run's clients held out (then the run may have trained on them)."""
    said = []
    if cfg.client_test_fraction <= 0:
        said.append("no per-client accuracy: client_test_fraction is 0, so no client holds a "
                    "share out; give client_test_fraction=0.2 (a run that held none out "
                    "trained on those shares)")
    elif saved is None:
        said.append("a model file: whether it was trained on these clients' shares is unknown "
                    "(its run directory knows)")
    elif changed := shares_changed(cfg, saved):
        said.append(f"{', '.join(changed)} differ from the run's: the clients' shares here are "
                    "not those its clients held out and may hold examples it trained on (the "
                    "test set's figures are unaffected)")
    if saved is not None and saved.get("superlink"):
        said.append("a deployed run: its nodes may have held other data than the partitions "
                    "rebuilt here")
    return said


def shares_changed(cfg, saved: dict) -> list[str]:
    """The settings that decide the clients' held-out shares and differ from the run's (where
    the data is read from, and the test set, aside)."""
    def data(section) -> dict:
        return {k: v for k, v in (section or {}).items()
                if k not in ("root", "download", "test_subset")}

    now = cfg.model_dump(mode="json")
    changed = [key for key in ("partition", "num_clients", "seed", "client_test_fraction")
               if now[key] != saved.get(key)]
    return (["dataset"] if data(now["dataset"]) != data(saved.get("dataset")) else []) + changed


def percent(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{100 * value:.2f}%"


def table(experiment, model_file: Path, result: dict, said: list[str]) -> str:
    """The console's report: the test set overall and per class, the clients, the notes."""
    from driftfl.common.partition import describe

    cfg, test = experiment.cfg, result["test"]

    lines = [f"{model_file}: model={cfg.model.name} on {cfg.dataset.name}, "
             f"{describe(cfg.partition)}, {cfg.num_clients} clients, seed {cfg.seed}",
             f"test accuracy {percent(test['accuracy'])}  loss {test['loss']:.4f}  "
             f"({test['examples']} images)", ""]
    width = max(len("class"), *(len(c["class"]) for c in test["classes"]))
    lines.append(f"{'class':<{width}}  {'images':>7}  {'accuracy':>8}")
    lines += [f"{c['class']:<{width}}  {c['examples']:>7}  {percent(c['accuracy']):>8}"
              for c in test["classes"]]
    if clients := result["clients"]:
        lines += ["", f"{'client':>6}  {'held out':>8}  {'accuracy':>8}"]
        lines += [f"{c['client']:>6}  {c['examples']:>8}  {percent(c['accuracy']):>8}"
                  for c in clients[:SHOWN_CLIENTS]]
        if len(clients) > SHOWN_CLIENTS:
            lines.append(f"... and {len(clients) - SHOWN_CLIENTS} more clients (in the JSON)")
        s = result["clients_spread"]
        lines.append(f"clients: mean {percent(s['mean'])}, std {percent(s['std'])}, worst 10% "
                     f"{percent(s['worst10'])}, best {percent(s['best'])}")
    lines += [f"note: {line}" for line in said]
    return "\n".join(lines)


def document(experiment, model_file: Path, overrides: list[str], result: dict,
             said: list[str]) -> str:
    """The JSON: what was evaluated on what, and the figures (an accuracy without examples to
    measure it on is null)."""
    cfg = experiment.cfg
    return json.dumps(json_safe({
        "model_file": str(model_file.absolute()), "overrides": overrides,
        "experiment": {"model": cfg.model.name, "dataset": cfg.dataset.name,
                       "partition": cfg.partition.model_dump(mode="json"),
                       "num_clients": cfg.num_clients, "seed": cfg.seed,
                       "client_test_fraction": cfg.client_test_fraction,
                       "aux_set_per_class": experiment.aux_per_class},
        **result, "notes": said}), indent=2) + "\n"


