"""The checkpoint holds arrays and JSON only: reading it runs nothing, and a checkpoint that
is not one this experiment wrote (truncated, empty, of another layout or version, another model
or strategy, NaN weights, a pickle) is refused in one line before anything runs."""

from __future__ import annotations

import io
import pickle
import re
import shutil
import subprocess
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from conftest import driftfl_bin
from support.cli import driftfl
from driftfl.common.config import compose
from driftfl.common.errors import ConfigError
from driftfl.methods import build_strategy
from driftfl.server import checkpoint, seal, treefile
from driftfl.server.app import run_experiment
from driftfl.server.experiment import prepare_experiment
from test_methods import InProcessGrid
from test_resume import Stopped, StoppingGrid, nodes


# what the CLI runs with, and the in-process run that leaves a checkpoint after round 1 of 2
SMALL = ["model=mlp", "dataset.subset=600", "dataset.test_subset=200", "rounds=2",
         "num_clients=2", "trust=clients"]  # resumed in simulation as it ran in-process


class Payload:
    """Unpickled, it would create the file ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory, fmnist_available) -> Path:
    """A run directory whose run stopped after round 1 of 2."""
    from flwr.supercore.task_identity import TaskIdentity

    run_dir = tmp_path_factory.mktemp("stopped")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):
            patch.setattr(TaskIdentity, name, value)
        with pytest.raises(Stopped):
            run_experiment(StoppingGrid(nodes(100), stop=2), experiment(), run_dir, run_id=1)
    return run_dir


def experiment(*more: str):
    return prepare_experiment(compose([*SMALL, *more]))


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return copy


def rewrite(run_dir: Path, change) -> Path:
    """The checkpoint's tree, changed in place by ``change``, written back."""
    path = run_dir / checkpoint.CHECKPOINT
    tree = treefile.read(path)
    change(tree)
    treefile.write(path, tree, seal.seal)  # sealed with this machine's key: only the checks
    return run_dir                         # below the tag (test_checkpoint_integrity) refuse it


def set_first_array(value: float):
    def change(tree):
        first = next(iter(tree["arrays"]))
        tree["arrays"][first] = np.full_like(tree["arrays"][first], value)
    return change


def pickled(marker: Path) -> bytes:
    return pickle.dumps({"round": 1, "payload": Payload(marker)})


def torch_pickled(marker: Path) -> bytes:  # the format of driftfl's earlier checkpoints
    buffer = io.BytesIO()
    torch.save({"round": 1, "payload": Payload(marker)}, buffer)
    return buffer.getvalue()


def write_bytes(make):
    def tamper(run_dir: Path) -> Path:
        path = run_dir / checkpoint.CHECKPOINT
        path.write_bytes(make(path))
        return run_dir
    return tamper


def write_tree(run_dir: Path, tree) -> Path:
    treefile.write(run_dir / checkpoint.CHECKPOINT, tree, seal.seal)
    return run_dir


def rewrite_with(change):
    return lambda run_dir: rewrite(run_dir, change)


TAMPERED = {
    "truncated": (write_bytes(lambda p: p.read_bytes()[:p.stat().st_size // 2]),
                  r"its checkpoint.pt has no integrity tag: it is truncated, or was not "
                  r"written by this driftfl"),
    "empty": (write_bytes(lambda p: b""), r"its checkpoint.pt is empty"),
    "not a dict": (lambda run_dir: write_tree(run_dir, [1, 2]),
                   r"its checkpoint.pt is not a driftfl checkpoint"),
    "missing keys": (rewrite_with(lambda t: [t.pop("rng"), t.pop("rows")]),
                     r"its checkpoint.pt lacks rng, rows"),
    "wrong shape": (rewrite_with(lambda t: t["arrays"].update(
        {"head.weight": np.zeros((3, 3), np.float32)})),
        r"holds the model array head.weight as float32 \(3, 3\); this experiment's model has "
        r"float32 \(10, 200\)"),
    "NaN weights": (rewrite_with(set_first_array(np.nan)),
                    r"holds a model whose features.1.weight has NaN or infinite values"),
    "unknown attribute": (rewrite_with(lambda t: t["strategy"].update(injected=1)),
                          r"holds strategy state that sets injected, which a FedAvg of this "
                          r"experiment does not keep as state; "),
    "a setting": (rewrite_with(lambda t: t["strategy"].update({"max_update_ratio": 1e30})),
                  r"holds strategy state that sets max_update_ratio, which a FedAvg of this "
                  r"experiment does not keep as state \(a setting: this experiment's, never a "
                  r"checkpoint's\)"),
}


def one_line_refusal(args: list[str], cwd: Path, real: bool = False) -> str:
    """`driftfl run <args>`'s one line, from the command's code in this process (support.cli)
    or, ``real``, from a real `driftfl` process."""
    out = (subprocess.run([driftfl_bin(), "run", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300) if real else driftfl("run", *args, cwd=cwd))
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1 and not out.stdout, out.stdout + out.stderr
    assert lines[0].startswith("driftfl: error: cannot resume "), lines[0]
    assert lines[0].endswith("resume another run directory, or run without resume= to start "
                             "afresh"), lines[0]
    return lines[0]


def listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_a_tampered_checkpoint_is_refused_in_one_line_before_anything_runs(
        case, stopped_run, tmp_path):
    tamper, expected = TAMPERED[case]
    run_dir = tamper(copy_of(stopped_run, tmp_path))
    before = listing(run_dir)
    line = one_line_refusal([*SMALL, f"resume={run_dir}"], tmp_path)
    assert re.search(expected, line), line
    assert listing(run_dir) == before  # nothing written, nothing launched


@pytest.mark.slow  # real `driftfl` processes
@pytest.mark.parametrize("make, unpickle", [
    (pickled, pickle.loads),
    (torch_pickled, lambda data: torch.load(io.BytesIO(data), weights_only=False))],
    ids=["pickle", "torch.save"])
def test_a_pickle_with_a_payload_is_refused_without_running_it(make, unpickle, stopped_run,
                                                               tmp_path):
    run_dir, marker = copy_of(stopped_run, tmp_path), tmp_path / "payload-ran"
    (run_dir / checkpoint.CHECKPOINT).write_bytes(make(marker))
    unpickle(make(tmp_path / "proof"))  # the payload runs where it is unpickled, as it was
    assert (tmp_path / "proof").exists()

    # a real process: what a user's resume of a planted pickle does, end to end
    line = one_line_refusal([*SMALL, f"resume={run_dir}"], tmp_path, real=True)
    assert "pickle, which is never loaded (loading one can run any code)" in line, line
    assert ("is in PyTorch's format (as earlier driftfl wrote it)" in line) == (
        make is torch_pickled), line
    assert not marker.exists()
    with pytest.raises(ConfigError, match="pickle, which is never loaded"):
        checkpoint.check(run_dir, experiment())
    assert not marker.exists()


def test_the_server_app_refuses_a_tampered_checkpoint_before_it_writes_anything(
        stopped_run, tmp_path, server_task):
    """A deployed run's ServerApp checks the checkpoint itself (driftfl run does not read it)."""
    run_dir = rewrite(copy_of(stopped_run, tmp_path), set_first_array(np.nan))
    before = listing(run_dir)
    with pytest.raises(ConfigError, match="holds a model whose features.1.weight has NaN"):
        run_experiment(InProcessGrid(nodes(200)), experiment(), run_dir, run_id=2, resume=True)
    assert listing(run_dir) == before


def test_the_untampered_checkpoint_is_accepted_as_written(stopped_run):
    state = checkpoint.check(stopped_run, experiment())
    assert state["round"] == 1 and [r["round"] for r in state["rows"]] == [0, 1]
    assert isinstance(state["rng"]["python"], tuple) and state["rng"]["torch"].dtype == torch.uint8


def refusal(run_dir: Path, change, *more: str) -> str:
    rewrite(run_dir, change)
    with pytest.raises(ConfigError) as refused:
        checkpoint.check(run_dir, experiment(*more))
    message = str(refused.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("change, expected", [
    (lambda t: t.update(version=1), "has format version 1; this driftfl reads version 4"),
    (lambda t: t.update(version=np.ones(2)), r"has format version array\(\[1., 1.\]\); this"),
    (lambda t: t.update(format=np.ones(2)), "is not a driftfl checkpoint"),
    (lambda t: t.update(extra=0), "holds what no checkpoint holds: extra"),
    (lambda t: t.update(round=0), "has round 0; a checkpoint is saved after a round 1 or later"),
    (lambda t: t["rows"].pop(), r"has no metrics row for each of rounds 0..1"),
    (lambda t: t["rows"][1].update(test_accuracy="high"), r"has no metrics row for each"),
    (lambda t: t["rows"][1].update(extra=np.zeros(2)), r"has no metrics row for each"),
    (lambda t: t["rows"][1].update(bytes_up_arrays="many"), r"has no metrics row for each"),
    (lambda t: t.update(seconds=float("nan")), r"has run time nan"),
    (lambda t: t["rng"].update(numpy=("MT19937", np.zeros(3, np.uint32), 0, 0, 0.0)),
     r"has random generators' states that cannot be restored"),
    (lambda t: t["rng"].update(torch=torch.zeros(3)),
     r"has random generators' states that cannot be restored"),
    (lambda t: t["recorded"].update(credibility=[1, 2]),
     r"has per-round arrays that are not arrays by name and round"),
    (set_first_array(np.inf), "holds a model whose features.1.weight has NaN or infinite"),
    (lambda t: t["arrays"].pop("head.bias"), r"holds a model with arrays \[.*\]; this "
                                             r"experiment's model has \[.*'head.bias'\]"),
    (lambda t: t["arrays"].update({"head.bias": t["arrays"]["head.bias"].astype(np.float64)}),
     r"holds the model array head.bias as float64 \(10,\)"),
    (lambda t: t["strategy"]["clients"].update(node_rank=[1, 2]),
     r"holds strategy state that has clients.node_rank as a list; this experiment's strategy "
     r"keeps a dict"),
    (lambda t: t["strategy"].pop("trained"), r"holds strategy state that lacks trained"),
    (lambda t: t.update(strategy=[1]), r"holds strategy state that is a list, not attributes "
                                       r"by name"),
    (lambda t: t["strategy"].update(selection=None),
     r"holds strategy state that has selection as a NoneType, not attributes by name"),
    (lambda t: t["strategy"].update(aggregate_train=0),  # would shadow the method
     r"sets aggregate_train, which a FedAvg of this experiment does not keep as state"),
    (lambda t: t["strategy"]["selection"].update(seed=7),
     r"sets selection.seed, which a Selection of this experiment does not keep as state"),
])
def test_a_checkpoint_that_does_not_fit_is_refused_in_one_line(change, expected, stopped_run,
                                                               tmp_path):
    message = refusal(copy_of(stopped_run, tmp_path), change)
    assert re.search(expected, message), message
    assert message.startswith(f"cannot resume {tmp_path / 'run'}: its checkpoint.pt ")


def test_state_arrays_of_another_shape_or_a_deque_of_another_length_are_refused(
        fmnist_available, tmp_path):
    """Checked against a strategy of the experiment, built afresh (FedProto, FedGKD)."""
    proto = build(["strategy=fedproto"])
    saved = checkpoint.state_of(proto) | {"present": np.zeros(11, bool)}
    assert "has present as a bool array of shape (11,); this experiment's strategy keeps " \
           "bool (10,)" in checkpoint.unlike_state(saved, proto, "")
    gkd = build(["strategy=fedgkd"])
    saved = checkpoint.state_of(gkd) | {"buffer": deque(maxlen=50)}
    assert "has buffer of length at most 50; this experiment's is 5" in \
        checkpoint.unlike_state(saved, gkd, "")
    assert checkpoint.unlike_state(checkpoint.state_of(gkd), gkd, "") is None


def build(overrides: list[str]):
    prepared = experiment(*overrides)
    model = prepared.initial_model()
    return build_strategy(prepared.cfg, model, prepared.aux_set(model))


def test_settings_are_never_saved_and_parts_keep_only_their_state(fmnist_available):
    strategy = build(["strategy=dcfl"])
    state = checkpoint.state_of(strategy)
    for setting in ("max_update_ratio", "fraction_train", "objective", "local_training",
                    "model", "seed", "filter_ratio", "augment", "proximal_mu"):
        assert setting not in state, setting
    assert state["selection"] == {"last_exploited": []}  # its seed and epsilon are settings
    assert {"store", "explored", "matrix", "started", "clients"} <= set(state)
    assert set(state["clients"]) == {"node_rank", "surveyed", "histograms", "excluded"}
    assert state["guard"] == {"strikes": {}}  # rounds in a row a client was rejected (exclude_after)
    assert "evaluation" not in state  # its bounds and clients are settings
    assert not {"report", "last_updates"} & set(state)  # one round's


def test_a_tree_comes_back_exactly_and_its_file_holds_no_pickle(tmp_path):
    tree = {"ints": {3: (1, 2.5, None), (1, "a"): [True, "x"]},
            "sets": [{1, 2}, frozenset({"a"})], "buffer": deque([1, 2], maxlen=4),
            "arrays": [np.arange(6, dtype=np.uint32).reshape(2, 3), np.zeros(0, np.float16),
                       np.array(3, np.int64)],
            "scalars": [np.float32(0.1), np.int64(5)], "tensor": torch.arange(3),
            "record": ArrayRecord({"w": Array(np.ones((2, 2), np.float32))}),
            "odd floats": [float("nan"), float("inf"), 0.1 + 0.2]}
    path = tmp_path / "tree"
    treefile.write(path, tree)
    back = treefile.read(path)
    assert list(back["ints"]) == [3, (1, "a")] and back["ints"][3] == (1, 2.5, None)
    assert back["sets"] == [{1, 2}, frozenset({"a"})] and type(back["sets"][1]) is frozenset
    assert back["buffer"] == deque([1, 2]) and back["buffer"].maxlen == 4
    for have, want in zip(back["arrays"], tree["arrays"]):
        assert have.dtype == want.dtype and have.shape == want.shape and (have == want).all()
    assert [type(s) for s in back["scalars"]] == [np.float32, np.int64]
    assert back["scalars"][0] == np.float32(0.1)
    assert torch.equal(back["tensor"], tree["tensor"])
    assert back["record"]["w"].numpy().tolist() == [[1, 1], [1, 1]]
    assert np.isnan(back["odd floats"][0]) and back["odd floats"][1:] == [float("inf"), 0.1 + 0.2]
    with np.load(path, allow_pickle=False) as archive:  # every member is a plain array
        assert all(archive[name].dtype != object for name in archive.files)
    with pytest.raises(TypeError, match="a Payload cannot be saved"):
        treefile.write(tmp_path / "other", {"payload": Payload(tmp_path / "x")})


@pytest.mark.parametrize("document, expected", [
    ({"dict": [[1]]}, "a dict that is not a list of pairs"),
    ({"object": []}, "an unknown tag 'object'"),
    ({"ndarray": "a9"}, "lacks the array 'a9'"),
    ({"dict": [[[1], 2]]}, r"cannot be read \(unhashable type: 'list'\)"),
    ({"tuple": [], "set": []}, "an object that is not a known tag"),
])
def test_a_tree_that_is_not_well_formed_is_refused(document, expected, tmp_path):
    import json

    path = tmp_path / "tree"
    with open(path, "wb") as f:
        np.savez(f, tree=np.frombuffer(json.dumps(document).encode(), np.uint8))
    with pytest.raises(treefile.UnreadableTree, match=expected):
        treefile.read(path)
