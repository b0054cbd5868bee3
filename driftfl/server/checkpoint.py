"""After every round the server saves what it needs to go on from there (checkpoint.pt in the
run directory): the global model, the strategy's server state (momentum, teachers and buffers,
prototypes, control variates, DCFL's store, ...), the random generators' states and the metrics
so far.

``driftfl run resume=<run dir>`` then runs the rounds after the last complete one, with the
overrides the run was started with, and ends with the same model and rows as the run that was
not interrupted (``rounds=N`` extends it).

The file holds arrays and JSON only (``treefile``: a NumPy archive read without pickle), so
reading it runs nothing. It ends in an HMAC tag over its bytes whose key lives outside the run
directory (seal.py): a checkpoint changed after driftfl wrote it (a model, a metrics row, the
DP accountant's state) or written under another machine's key is refused unread; so is one
whose arrays declare more bytes than the experiment can need (``size_limit``), before any is
inflated. Before anything runs, a checkpoint is checked against the experiment
and against a freshly built model and strategy: the model's arrays must have their names,
shapes and dtypes and be finite; the strategy state must be what a strategy of this experiment
keeps, attribute for attribute, of the same types (arrays: dtypes and shapes). A strategy's
settings (what its constructor takes: max_update_ratio, the learning rates, ...) come from the
experiment and are never read from the file. Any other file is refused in one line.

What a client keeps between rounds (SCAFFOLD's c_k, MOON's previous model) is the client's, not
in the checkpoint: after a resume those methods start it again, as for a client that joins late.
"""

from __future__ import annotations

import inspect
import json
import math
import random
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel
from torch import nn

from driftfl.common.config import ExperimentConfig
from driftfl.common.errors import ConfigError
from driftfl.common.protocol import model_to_arrays
from driftfl.common.settings import OPERATIONAL

from driftfl.common.untrusted import UnsafeFile, read_bytes

from . import seal, treefile

CHECKPOINT = "checkpoint.pt"
FORMAT = "driftfl checkpoint"
VERSION = 4  # 1 was the pickle of earlier driftfl, refused unread; 2 kept the survey's state
#              on the strategy itself, not in its clients part; 3 had no ledger binding
# strategy attributes that belong to one round (the replies, the round's report, the round
# plan's assignments, drawn afresh from the seed each round; a DP release's diagnostics, kept in
# the rows; the charge of the round going out, in the privacy ledger) or to one process (the
# roster holds the grid): made afresh, never saved
TRANSIENT = frozenset({"train_messages", "last_updates", "report", "payload_sum", "released",
                       "plan", "diagnostics", "clipped", "pending"})
KEYS = ("format", "version", "round", "config", "arrays", "strategy", "rng", "rows",
        "recorded", "seconds", "ledger")
ROW_NUMBERS = ("round", "test_accuracy", "test_loss", "model_updated", "bytes_sent",
               "bytes_received")  # what the run's summary reads from every row (and bytes_*)
RESUMABLE = OPERATIONAL | {"rounds"}  # what a resumed run may set anew
ADVICE = "resume another run directory, or run without resume= to start afresh"


def save(run_dir: Path, server_round: int, arrays: dict[str, np.ndarray], strategy,
         rows: list[dict], recorded: dict, seconds: float, cfg: ExperimentConfig,
         ledger: dict | None = None) -> None:
    """Write the checkpoint after ``server_round``; atomic (a kill mid-write keeps the last).
    ``ledger``: the privacy ledger's binding (its run id and the generation written before
    this checkpoint, ledger.Ledger.binding)."""
    treefile.write(Path(run_dir) / CHECKPOINT, seal=seal.seal, tree={
        "ledger": ledger or {},
        "format": FORMAT, "version": VERSION, "round": server_round,
        "config": cfg.model_dump(mode="json"), "arrays": arrays,
        "strategy": state_of(strategy),
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                "torch": torch.get_rng_state()},
        "rows": rows, "recorded": recorded, "seconds": seconds})


def size_limit(model: nn.Module) -> int:
    """Bytes the arrays of a checkpoint of ``model``'s experiment may declare: the model 64
    times over (teachers, buffers, control variates, FedCurv's sums, ...) or 1 GiB, whichever
    is more. A file declaring more is refused before anything in it is inflated."""
    return max(treefile.LIMIT, 64 * sum(p.numel() * p.element_size()
                                        for p in model.state_dict().values()))


def read(path: Path, limit: int) -> Any:
    """The tree of the checkpoint at ``path`` once its tag verifies (seal.py) and its arrays
    declare at most ``limit`` bytes; UnreadableTree says why not."""
    try:
        data = read_bytes(path, limit + treefile.SLACK)
    except UnsafeFile as err:
        raise treefile.UnreadableTree(str(err).removeprefix(f"{path} ")) from None
    except OSError as err:
        raise treefile.UnreadableTree(f"cannot be read ({err.strerror or err})") from None
    treefile.sniff(data)  # a pickle is named as one, tag or not
    try:
        return treefile.loads(seal.unseal(data), limit)
    except seal.Unsealed as err:
        raise treefile.UnreadableTree(str(err)) from None


def load(run_dir: Path, cfg: ExperimentConfig, model: nn.Module, strategy) -> dict | None:
    """The checkpoint of ``run_dir``, once it is known to be a checkpoint of this experiment
    that fits ``model`` and ``strategy`` (both freshly built for it); None where the run
    stopped before its first checkpoint but its privacy ledger says rounds went out (it goes
    on from round 0, every charge kept); ConfigError says in one line why it cannot be
    resumed."""
    from .ledger import LEDGER

    path = Path(run_dir) / CHECKPOINT
    if not (path.is_file() or path.is_symlink()):  # a link: refused as one by read
        if (Path(run_dir) / LEDGER).exists() and hasattr(strategy.release, "lost"):
            return None
        raise ConfigError(f"cannot resume {run_dir}: it has no {CHECKPOINT} (a run writes one "
                          "after every round; choose the run directory of a stopped run)")
    try:
        state = read(path, size_limit(model))
    except treefile.UnreadableTree as err:
        raise ConfigError(f"cannot resume {run_dir}: its {CHECKPOINT} {err}; {ADVICE}") from None
    if problem := malformed(state):
        raise ConfigError(f"cannot resume {run_dir}: its {CHECKPOINT} {problem}; {ADVICE}")
    differ = differences(state["config"], cfg.model_dump(mode="json"))
    if differ:
        raise ConfigError(f"cannot resume {run_dir}: its experiment differs in "
                          f"{', '.join(differ)}; a resumed run keeps the settings it ran with "
                          f"(its config.yaml) but for rounds and {', '.join(sorted(OPERATIONAL))}")
    if state["round"] >= cfg.rounds:
        raise ConfigError(f"cannot resume {run_dir}: all {cfg.rounds} rounds are done; more "
                          f"with rounds=<more than {state['round']}>")
    if problem := unfit(state, model, strategy):
        raise ConfigError(f"cannot resume {run_dir}: its {CHECKPOINT} {problem}; {ADVICE}")
    return state


def saved_round(run_dir: Path) -> tuple[int, int] | None:
    """(the round saved, the run's rounds) of ``run_dir``'s checkpoint; None without one that
    can be read (only that is read: a stopped run's message says what it saved)."""
    try:
        state = treefile.read(Path(run_dir) / CHECKPOINT)
        return int(state["round"]), int(state["config"]["rounds"])
    except (OSError, treefile.UnreadableTree, KeyError, TypeError, ValueError):
        return None


def check(run_dir: Path, experiment) -> dict:
    """``load`` against a model and strategy built for ``experiment`` (a prepared Experiment),
    as the run will build them, and a DP run's privacy ledger: for the checks before a run is
    launched."""
    from driftfl.methods import build_strategy

    from . import ledger

    model = experiment.initial_model()
    strategy = build_strategy(experiment.cfg, model, experiment.aux_set(model))
    saved = load(run_dir, experiment.cfg, model, strategy)
    ledger.resumed(run_dir, strategy.release, saved)  # a DP run's ledger, too
    return saved


def malformed(state: Any) -> str | None:
    """What is wrong with the checkpoint's layout (None: nothing)."""
    if not (isinstance(state, dict) and is_json(state.get("format"))
            and state["format"] == FORMAT):
        return "is not a driftfl checkpoint"
    version = state.get("version")
    if not (type(version) is int and version == VERSION):
        return f"has format version {version!r:.40}; this driftfl reads version {VERSION}"
    if missing := [k for k in KEYS if k not in state]:
        return f"lacks {', '.join(missing)}"
    if unknown := [str(k) for k in state if k not in KEYS]:
        return f"holds what no checkpoint holds: {', '.join(unknown)}"
    rows, server_round = state["rows"], state["round"]
    if type(server_round) is not int or server_round < 1:
        return f"has round {server_round!r:.40}; a checkpoint is saved after a round 1 or later"
    if not (isinstance(state["config"], dict) and is_json(state["config"])):
        return "has no experiment config"
    if not (isinstance(rows, list) and len(rows) == server_round + 1 and is_json(rows)
            and all(isinstance(r, dict) and all(isinstance(r.get(k), (int, float)) for k in
                                                ROW_NUMBERS) and r["round"] == i
                    and all(isinstance(v, (int, float)) for k, v in r.items()
                            if k.startswith("bytes_"))
                    for i, r in enumerate(rows))):
        return (f"has no metrics row for each of rounds 0..{server_round} (each with "
                f"{', '.join(ROW_NUMBERS)})")
    recorded = state["recorded"]
    if not (isinstance(recorded, dict) and all(
            isinstance(k, str) and isinstance(v, dict)
            and all(isinstance(a, np.ndarray) for a in v.values()) for k, v in recorded.items())):
        return "has per-round arrays that are not arrays by name and round"
    if not (isinstance(state["seconds"], float) and 0 <= state["seconds"] < math.inf):
        return f"has run time {state['seconds']!r:.40}; expected seconds"
    binding = state["ledger"]
    if not (isinstance(binding, dict) and (binding == {} or (
            isinstance(binding.get("run"), str) and type(binding.get("generation")) is int
            and set(binding) == {"run", "generation"}))):
        return "has a privacy ledger binding that is not a run id and a generation"
    return bad_random(state["rng"])


def is_json(value: Any) -> bool:
    """Whether ``value`` is what JSON holds (the config, the metrics rows)."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_json(v) for k, v in value.items())
    if isinstance(value, list):
        return all(is_json(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def bad_random(rng: Any) -> str | None:
    """Why the saved random generators' states cannot be restored (None: they can); tried on
    generators of their own, so the process's stay as they are."""
    try:
        random.Random().setstate(rng["python"])
        np.random.RandomState().set_state(rng["numpy"])
        if not (isinstance(rng["torch"], torch.Tensor) and rng["torch"].dtype == torch.uint8):
            raise TypeError("torch's state is not bytes")
        torch.Generator().set_state(rng["torch"])
    except Exception as err:
        return f"has random generators' states that cannot be restored ({err})"
    return None


def unfit(state: dict, model: nn.Module, strategy) -> str | None:
    """Why the saved model or strategy state does not fit this experiment's (None: it does)."""
    saved = state["arrays"]
    expected = {k: v.numpy() for k, v in model_to_arrays(model).items()}
    if not isinstance(saved, dict) or list(saved) != list(expected):
        names = list(saved) if isinstance(saved, dict) else type(saved).__name__
        return f"holds a model with arrays {names}; this experiment's model has {list(expected)}"
    for name, want in expected.items():
        have = saved[name]
        if not (isinstance(have, np.ndarray) and have.dtype == want.dtype
                and have.shape == want.shape):
            got = f"{have.dtype} {have.shape}" if isinstance(have, np.ndarray) else "no array"
            return (f"holds the model array {name} as {got}; this experiment's model has "
                    f"{want.dtype} {want.shape}")
        if have.dtype.kind in "fc" and not np.isfinite(have).all():
            return f"holds a model whose {name} has NaN or infinite values"
    problem = unlike_state(state["strategy"], strategy, "")
    return f"holds strategy state that {problem}" if problem else None


# -- the strategy's state ------------------------------------------------------------------
@cache
def settings_of(cls: type) -> frozenset[str]:
    """What an object of ``cls`` is built with: every named argument of the constructors in
    its class hierarchy. The experiment fixes them; they are never saved or restored."""
    names = set()
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if inspect.isfunction(init):
            names |= {p.name for p in inspect.signature(init).parameters.values()
                      if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return frozenset(names - {"self"})


def is_part(value: Any) -> bool:
    """A driftfl object a strategy is built from or keeps (its selection, its aggregation,
    DCFL's round log, ...): its state is saved attribute by attribute. Models are not parts:
    a strategy's models are scratch copies (the global model is the checkpoint's arrays).
    Nor are settings (pydantic models): the experiment fixes them."""
    return (type(value).__module__.startswith("driftfl.") and hasattr(value, "__dict__")
            and not isinstance(value, (nn.Module, BaseModel)) and not isinstance(value, type))


def state_names(obj: Any, part: bool = False) -> list[str]:
    """The attributes of ``obj`` (a strategy, or with ``part`` one of its parts) that a
    checkpoint keeps. The strategy's parts are its state (the selection it was built with keeps
    what it explored); a part's constructor arguments are its settings, parts among them (the
    guard is given the strategy's clients, which the strategy keeps)."""
    settings = settings_of(type(obj))
    return [name for name, value in vars(obj).items() if name not in TRANSIENT
            and not (part and name in settings)
            and (state_names(value, True) if is_part(value) else name not in settings)]


def state_of(obj: Any, part: bool = False) -> dict[str, Any]:
    """The state of a strategy or a part: a part's as a dict of its own."""
    return {name: state_of(value, True) if is_part(value) else value
            for name in state_names(obj, part) for value in [getattr(obj, name)]}


def unlike_state(saved: Any, obj: Any, path: str) -> str | None:
    """Why ``saved`` cannot be the state of ``obj``, a freshly built strategy or part (None:
    it can); ``path`` names ``obj`` in the message (empty: the strategy)."""
    names = state_names(obj, part=bool(path))
    if not isinstance(saved, dict):
        whole = f"has {path.rstrip('.')} as" if path else "is"
        return f"{whole} a {type(saved).__name__}, not attributes by name"
    if unknown := [str(k) for k in saved if k not in names]:
        settings = " (a setting: this experiment's, never a checkpoint's)" if any(
            k in settings_of(type(obj)) for k in unknown) else ""
        return (f"sets {', '.join(path + k for k in unknown)}, which a "
                f"{type(obj).__name__} of this experiment does not keep as state{settings}")
    if missing := [k for k in names if k not in saved]:
        return f"lacks {', '.join(path + k for k in missing)}"
    for name in names:
        fresh = getattr(obj, name)
        problem = (unlike_state(saved[name], fresh, f"{path}{name}.") if is_part(fresh)
                   else unlike(saved[name], fresh, path + name))
        if problem:
            return problem
    return None


def unlike(saved: Any, fresh: Any, name: str) -> str | None:
    """Why ``saved`` cannot stand where a fresh strategy has ``fresh`` (None: it can). State
    that a strategy makes in its first round (None before) can only be checked then."""
    if fresh is None:
        return None
    if type(saved) is not type(fresh):
        return (f"has {name} as a {type(saved).__name__}; this experiment's strategy keeps a "
                f"{type(fresh).__name__}")
    if isinstance(fresh, np.ndarray) and (
            saved.dtype != fresh.dtype or (saved.shape != fresh.shape if fresh.size
                                           else saved.ndim != fresh.ndim)):
        return (f"has {name} as a {saved.dtype} array of shape {saved.shape}; this "
                f"experiment's strategy keeps {fresh.dtype} {fresh.shape}")
    if getattr(fresh, "maxlen", None) != getattr(saved, "maxlen", None):  # deques
        return f"has {name} of length at most {saved.maxlen}; this experiment's is {fresh.maxlen}"
    if isinstance(fresh, dict):
        for key in fresh.keys() & saved.keys():
            if problem := unlike(saved[key], fresh[key], f"{name}[{key!r}]"):
                return problem
    return None


def restore(strategy, state: dict, clients: list[dict]) -> dict[int, int]:
    """Put the saved server state into a freshly built strategy, before it meets this run's
    clients: state keyed by node id follows each partition to its node id in this run.
    Returns those moves (old -> new node id)."""
    put_state(strategy, state["strategy"])
    now = {c["partition_id"]: c["node_id"] for c in clients if c["partition_id"] >= 0}
    saved = state["strategy"].get("clients", {}).get("node_rank", {})
    moved = {old: now[p] for old, p in saved.items()
             if isinstance(p, int) and p in now and now[p] != old}
    strategy.follow_clients(moved)
    return moved


def put_state(obj: Any, saved: dict[str, Any]) -> None:
    for name, value in saved.items():
        if is_part(getattr(obj, name)):
            put_state(getattr(obj, name), value)
        else:
            setattr(obj, name, value)


def restore_random(state: dict) -> None:
    """The random generators as they were after the saved round."""
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])


def differences(saved: dict, wanted: dict, prefix: str = "") -> list[str]:
    """The settings (dotted keys, with both values) in which two experiments differ, those a
    resumed run may change aside: the operational ones, and rounds (no server state depends on
    how many are to come, so a run extended by a resume trains as the longer run would; only
    per-client evaluation, which measures the last round too, has measured one more round)."""
    found = []
    for key in sorted(set(saved) | set(wanted)):
        if f"{prefix}{key}" in RESUMABLE:
            continue
        a, b = saved.get(key), wanted.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            found.append(f"{prefix}{key} ({json.dumps(a)} there, {json.dumps(b)} here)")
    return found
