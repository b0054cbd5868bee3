"""``tracker=wandb``: Weights & Biases, which needs no account or server: unless ``WANDB_MODE``
says otherwise the run is written offline under ``<run dir>/wandb`` (nothing leaves the machine;
``wandb sync <run dir>/wandb/offline-run-*`` uploads it later, under your account). The
flattened experiment config is the run's config, every numeric column of metrics.csv is logged
per round (step = round), and the summary's numbers are the run's summary. ``<run dir>/wandb.json``
names the W&B run, so that a resumed run goes on in it.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from driftfl.common.columns import plottable
from driftfl.common.errors import ConfigError

RECORD = "wandb.json"  # the W&B run this run directory's rounds went to


def check_wandb() -> None:
    """ConfigError in one line where wandb is missing: in `driftfl run` before the launch, and
    in the ServerApp before its first round (a deployed one's machine)."""
    if importlib.util.find_spec("wandb") is None:
        raise ConfigError("tracker=wandb needs the wandb package, which is not installed: "
                          ".venv/bin/python -m pip install wandb (or choose tracker=tensorboard "
                          "or tracker=mlflow)")


class WandbTracker:
    """Starts its W&B run at the first round, from what the run directory holds by then:
    config.yaml (the config) and meta.json (whether the run goes on after a stop)."""

    def __init__(self, run_dir: Path):
        check_wandb()  # before any round, on the ServerApp's machine
        self.dir, self.run = run_dir, None

    def _start(self) -> None:
        import wandb
        import yaml

        from driftfl.report.runs import flatten

        config = yaml.safe_load((self.dir / "config.yaml").read_text())
        record = self.dir / RECORD
        resumed = "resumed_after_round" in json.loads((self.dir / "meta.json").read_text())
        earlier = json.loads(record.read_text()) if resumed and record.is_file() else {}
        mode = os.environ.get("WANDB_MODE", "offline")  # nothing leaves unless asked
        self.run = wandb.init(
            dir=str(self.dir), project=os.environ.get("WANDB_PROJECT", "driftfl"),
            name=config["label"], config=flatten(config), mode=mode,
            id=earlier.get("id"), resume="must" if earlier else None,
            settings=wandb.Settings(silent=True, console="off"))
        record.write_text(json.dumps({"id": self.run.id, "mode": mode}) + "\n")
        where = f"{self.dir / 'wandb'} (upload later: wandb sync)" if mode == "offline" \
            else self.run.url
        print(f"driftfl: W&B run {self.run.id} ({mode}) at {where}", flush=True)

    def add_round(self, flat_row: dict) -> None:
        if self.run is None:
            self._start()
        self.run.log({key: float(value) for key, value in flat_row.items()
                      if key != "round" and plottable(value)}, step=int(flat_row["round"]))

    def close(self) -> None:
        """The summary's numbers, and the run's end."""
        if self.run is None:
            self._start()
        summary_file = self.dir / "summary.json"
        summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
        self.run.summary.update({f"summary.{key}": value for key, value in summary.items()
                                 if plottable(value)})
        run, self.run = self.run, None
        run.finish(exit_code=1 if summary.get("status") == "failed" else 0)
