"""After every round the server saves what it needs to go on from there (checkpoint.pt in the
run directory): the global model, the strategy's whole server state (momentum, teachers and
buffers, prototypes, control variates, DCFL's store, ...: every attribute but the few below that
belong to one round or one process), the random generators' states and the metrics so far.

``driftfl run <overrides> resume=<run dir>`` then runs the rounds after the last complete one
and ends with the same model and rows as the run that was not interrupted. The file is a pickle
(Python objects of the strategy): resume only run directories you trust.

What a client keeps between rounds (SCAFFOLD's c_k, MOON's previous model) is the client's, not
in the checkpoint: after a resume those methods start it again, as for a client that joins late.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import torch

from driftfl.common.config import ExperimentConfig
from driftfl.common.errors import ConfigError

CHECKPOINT = "checkpoint.pt"
# strategy attributes that belong to one round (the replies, the round's report) or to one
# process (the roster holds the grid): made afresh, never saved
TRANSIENT = frozenset({"roster", "last_updates", "report"})
# settings that change how a run is carried out, not what it computes (a simulated client's
# cores do: they are its torch threads)
OPERATIONAL = frozenset({"verbose", "tracker", "node_wait", "round_timeout", "min_clients",
                         "rejoin_wait", "simulation.ray_address", "simulation.client_gpus",
                         "superlink"})


def save(run_dir: Path, server_round: int, arrays: dict[str, np.ndarray], strategy,
         rows: list[dict], recorded: dict, seconds: float, cfg: ExperimentConfig) -> None:
    """Write the checkpoint after ``server_round``; atomic (a kill mid-write keeps the last)."""
    state = {"round": server_round, "config": cfg.model_dump(mode="json"), "arrays": arrays,
             "strategy": {k: v for k, v in vars(strategy).items() if k not in TRANSIENT},
             "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                     "torch": torch.get_rng_state()},
             "rows": rows, "recorded": recorded, "seconds": seconds}
    partial = run_dir / f"{CHECKPOINT}.partial"
    torch.save(state, partial)
    os.replace(partial, run_dir / CHECKPOINT)


def load(run_dir: Path, cfg: ExperimentConfig) -> dict:
    """The checkpoint of ``run_dir``, once its run is known to be this experiment;
    ConfigError says why it cannot be resumed."""
    path = Path(run_dir) / CHECKPOINT
    if not path.is_file():
        raise ConfigError(f"cannot resume {run_dir}: it has no {CHECKPOINT} (a run writes one "
                          "after every round; choose the run directory of a stopped run)")
    state = torch.load(path, weights_only=False)  # pickle: see the module's note
    differ = differences(state["config"], cfg.model_dump(mode="json"))
    if differ:
        raise ConfigError(f"cannot resume {run_dir}: its experiment differs in "
                          f"{', '.join(differ)}; resume with the overrides it ran with "
                          f"(its config.yaml)")
    if state["round"] >= cfg.rounds:
        raise ConfigError(f"cannot resume {run_dir}: all {cfg.rounds} rounds are done")
    return state


def differences(saved: dict, wanted: dict, prefix: str = "") -> list[str]:
    """The settings (dotted keys, with both values) in which two experiments differ, the
    operational ones aside."""
    found = []
    for key in sorted(set(saved) | set(wanted)):
        if f"{prefix}{key}" in OPERATIONAL:
            continue
        a, b = saved.get(key), wanted.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            found.append(f"{prefix}{key} ({json.dumps(a)} there, {json.dumps(b)} here)")
    return found


def restore(strategy, state: dict, clients: list[dict]) -> dict[int, int]:
    """Put the saved server state into a freshly built strategy, before it meets this run's
    clients: state keyed by node id follows each partition to its node id in this run.
    Returns those moves (old -> new node id)."""
    vars(strategy).update(state["strategy"])
    now = {c["partition_id"]: c["node_id"] for c in clients if c["partition_id"] >= 0}
    saved = state["strategy"].get("node_rank", {})
    moved = {old: now[p] for old, p in saved.items() if p in now and now[p] != old}
    strategy.rekey(moved)
    return moved


def restore_random(state: dict) -> None:
    """The random generators as they were after the saved round."""
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
