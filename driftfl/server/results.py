"""The run directory: config, provenance, per-round metrics, partition, final model; its
pictures are drawn by plots.py."""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import threading
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
import yaml

from driftfl.common.config import ExperimentConfig
from driftfl.common.leakage import to_pixels
from driftfl.common.partition import describe
from driftfl.common.json_values import json_safe
from driftfl.resume import STOPPED

from .plots import (clients_tell_something, plot_accuracy, plot_clients, plot_heatmaps,
                    plot_image_grid, plot_partition, plot_per_class)
from .tracker import make_tracker

PACKAGES = ("driftfl", "flwr", "flwr-datasets", "torch", "torchvision", "numpy", "hydra-core",
            "ray")


def git_revision() -> str:
    """The source tree's commit (+ '-dirty'), or what the launcher passed down, or 'unknown'."""
    source = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("DRIFTFL_GIT_REVISION", "unknown")


def versions() -> dict[str, str]:
    import driftfl

    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:  # driftfl runs from a source tree or app bundle
            found[name] = driftfl.__version__ if name == "driftfl" else "not installed"
    return found


def _flat_row(row: dict) -> dict:
    """A CSV row: lists become numbered columns (per_class_accuracy -> acc_class_0, ...)."""
    flat = {}
    for key, value in row.items():
        if isinstance(value, list):
            stem = "acc_class" if key == "per_class_accuracy" else key
            flat.update({f"{stem}_{i}": v for i, v in enumerate(value)})
        elif isinstance(value, dict):  # condense_seconds -> condense_seconds_client_3, ...
            flat.update({f"{key}_{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


CLIENTS_CSV = "clients.csv"


def _earlier_clients(run_dir: Path, last_round: int) -> list[dict]:
    """clients.csv's rows up to the round a resumed run goes on after (as written)."""
    path = run_dir / CLIENTS_CSV
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [{**r, "round": int(r["round"])} for r in rows if int(r["round"]) <= last_round]


_PYPLOT = threading.Lock()  # pyplot is not thread-safe: a drawing thread takes it


def _draw_alone(plot, *args) -> None:
    with _PYPLOT:
        plot(*args)


class RunRecorder:
    """Writes one run's directory; metrics are rewritten every round so a crash keeps them."""

    def __init__(self, run_dir: Path, cfg: ExperimentConfig, run_id: int | None = None,
                 resumed: dict | None = None):
        """``resumed``: the checkpoint a resumed run goes on from (its rows and arrays)."""
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict] = list(resumed["rows"]) if resumed else []
        # name -> {"round_<r>": array}
        self.arrays: dict[str, dict[str, np.ndarray]] = dict(resumed["recorded"]) if resumed else {}
        # the rounds' wall time of the parts before a resume (their start-ups apart); this
        # part's rounds start when its start-up ends (begin_rounds)
        self.seconds_before = resumed["seconds"] if resumed else None
        self.startup_seconds, self.started = 0.0, time.time()
        self.drawing: threading.Thread | None = None  # partition.png, while it is drawn
        earlier = self.dir / "partition.json"  # a resumed run keeps the moves made before
        self.node_changes: list[dict] = (json.loads(earlier.read_text()).get("node_changes", [])
                                         if resumed and earlier.is_file() else [])
        self.tracker = make_tracker(cfg.tracker, self.dir)
        # deployed nodes report their own label counts in the data survey; the server has no
        # data of theirs to check them against (partition.png says so)
        self.split = ("as the nodes reported them" if cfg.superlink is not None
                      else f"{describe(cfg.partition)} split")
        self.classes: list[str] | None = None  # the dataset's class names, once known
        # per-client evaluation's rows (clients.csv); a resumed run keeps its earlier rounds'
        self.clients: list[dict] = _earlier_clients(self.dir, resumed["round"]) if resumed else []
        (self.dir / "config.yaml").write_text(
            yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        meta = {"versions": versions(), "git_revision": git_revision(), "flower_run_id": run_id,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
                "device": cfg.device, "torch_threads": torch.get_num_threads()}
        if resumed:  # the earlier parts' provenance, then this part's
            # a finished run given more rounds is running again: its old summary would tell
            # `driftfl report` and a stop's line that it had finished; the new one comes at
            # its end (metrics.json and the checkpoint keep every round meanwhile)
            (self.dir / "summary.json").unlink(missing_ok=True)
            (self.dir / STOPPED).unlink(missing_ok=True)  # and the line of its last stop
            known = self.dir / "meta.json"
            earlier = json.loads(known.read_text()) if known.is_file() else {}
            meta["resumed_after_round"] = resumed["round"]
            meta["earlier"] = [*earlier.pop("earlier", []), earlier]
        self._write_json("meta.json", meta)

    def begin_rounds(self, startup_seconds: float) -> None:
        """The run's start-up took ``startup_seconds``; its rounds begin now."""
        self.startup_seconds, self.started = startup_seconds, time.time()

    def seconds(self) -> float:
        """Wall time of this part's rounds so far (not its start-up, nor a resumed run's
        earlier parts)."""
        return time.time() - self.started

    def total_seconds(self) -> float:
        """Wall time of the rounds of every part so far: what a checkpoint keeps."""
        return (self.seconds_before or 0.0) + self.seconds()

    def timing(self) -> dict[str, float]:
        """The summary's times: this part's rounds and its start-up, and a resumed run's
        earlier parts' rounds apart."""
        before = {} if self.seconds_before is None else {
            "seconds_before_resume": self.seconds_before}
        return {"seconds": self.seconds(), "startup_seconds": self.startup_seconds, **before}

    def _write_json(self, name: str, payload) -> None:
        (self.dir / name).write_text(json.dumps(json_safe(payload), indent=2) + "\n")

    def partition(self, summary: dict) -> None:
        """partition.json: the data, the split and which node holds each client's share."""
        self.partition_summary = {**summary, "node_changes": self.node_changes}
        self._write_json("partition.json", self.partition_summary)
        self.classes = summary.get("classes")
        counted = [c for c in summary.get("clients", []) if c.get("label_histogram")]
        if counted:  # partition.png: the clients' label counts, where they are known
            # drawn beside the first round, not in the run's start-up
            self.drawing = threading.Thread(target=_draw_alone, daemon=True, args=(
                plot_partition, counted, self.classes, self.dir / "partition.png",
                f"clients' training labels on {summary.get('dataset', '?')} ({self.split})"))
            self.drawing.start()

    def drawn(self) -> None:
        """Wait for partition.png: matplotlib draws one picture at a time."""
        if self.drawing is not None:
            self.drawing.join()
            self.drawing = None

    def clients_moved(self, clients: list[dict], moved: dict[int, int]) -> None:
        """Restarted nodes took their partitions back under new node ids (old -> new):
        partition.json names the node holding each partition now, and every change."""
        partition_of = {c["node_id"]: c["partition_id"] for c in clients}
        self.partition_summary["clients"] = clients
        self.node_changes += [
            {"partition_id": partition_of[new], "from_node": old, "to_node": new}
            for old, new in moved.items()]
        self._write_json("partition.json", self.partition_summary)

    def add_round(self, row: dict) -> None:
        self.rows.append(row)
        flat = [_flat_row(r) for r in self.rows]
        columns = list(dict.fromkeys(k for r in flat for k in r))
        for r in flat:  # a payload kind a round did not send: 0 bytes, not an empty cell
            r.update({k: 0 for k in columns if k.startswith("bytes_") and k not in r})
        with open(self.dir / "metrics.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(flat)
        self._write_json("metrics.json", {"rounds": self.rows})
        if self.tracker:
            self.tracker.add_round(flat[-1])

    def add_clients(self, server_round: int, rows: list[dict]) -> None:
        """clients.csv: each round's clients (client_eval.client_rows), every round so far."""
        if not rows:
            return
        self.clients += rows
        with open(self.dir / CLIENTS_CSV, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(
                k for r in self.clients for k in r)))
            writer.writeheader()
            writer.writerows(self.clients)

    def add_arrays(self, server_round: int, arrays: dict[str, np.ndarray]) -> None:
        """Per-round arrays (FedSSD's credibility matrix, ...) -> <name>.npz, key round_<r>."""
        for name, value in arrays.items():
            self.arrays.setdefault(name, {})[f"round_{server_round}"] = np.asarray(value)
            np.savez_compressed(self.dir / f"{name}.npz", **self.arrays[name])

    def add_images(self, images: dict[str, tuple[np.ndarray, np.ndarray]], mean, std) -> None:
        self.drawn()
        """Image sets (DCFL's condensed sets) under images/: a PNG grid, a row per class, and
        the arrays in the dataset's pixel scale (``x`` uint8 (N, H, W) or (N, H, W, C), ``y``),
        which `driftfl audit` and any script can compare with the clients' real data."""
        for name, (x, y) in images.items():
            if not len(y):  # a DCFL client with no class to condense shipped nothing
                continue
            folder = self.dir / "images"
            folder.mkdir(exist_ok=True)
            pixels = to_pixels(x, mean, std)
            plot_image_grid(pixels, y, folder / f"{name}.png", name)
            np.savez_compressed(folder / f"{name}.npz", x=pixels, y=np.asarray(y, dtype=np.int64))

    def finish(self, model: torch.nn.Module, summary: dict, title: str) -> None:
        self.drawn()
        torch.save(model.state_dict(), self.dir / "model.pt")
        self._write_json("metrics.json", {"rounds": self.rows, "summary": summary})
        self._write_json("summary.json", summary)
        plot_accuracy(self.rows, self.dir / "accuracy.png", title)
        plot_per_class(self.rows, self.classes, self.dir / "per_class.png", title)
        if clients_tell_something(self.clients):  # clients.csv is written all the same
            plot_clients(self.clients, self.dir / "clients.png", title)
        for name, by_round in self.arrays.items():
            plot_heatmaps(by_round, self.dir / f"{name}.png", name)
        if self.tracker:
            self.tracker.close()
