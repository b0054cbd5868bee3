"""A checkpoint resumes only as driftfl wrote it: its HMAC tag (key outside the run directory,
driftfl/server/seal.py) fails for a changed model, metrics row or strategy state and for a
checkpoint written under another key; an archive declaring more than the experiment can need
is refused before any member is inflated. One line, exit 2, nothing written."""

from __future__ import annotations

import io
import os
import re
import stat
import zipfile

import numpy as np
import pytest

from driftfl.common.errors import ConfigError
from driftfl.server import checkpoint, seal, treefile
from test_checkpoint import (SMALL, copy_of, experiment, listing, one_line_refusal,  # noqa: F401
                             stopped_run)



def forge(run_dir, change, tag: bytes | None = None):
    """The checkpoint changed as one who can write the run directory but lacks the key would:
    the tree rewritten, the old tag (or ``tag``) put back after it."""
    path = run_dir / checkpoint.CHECKPOINT
    old = path.read_bytes()[-seal.OVERHEAD:]
    tree = treefile.read(path)
    change(tree)
    treefile.write(path, tree, lambda data: data + (old if tag is None else tag))
    return run_dir


def negate_head(tree):
    for name in ("head.weight", "head.bias"):
        tree["arrays"][name] = -tree["arrays"][name]


def forge_best_accuracy(tree):
    tree["rows"][1]["test_accuracy"] = 0.999


def forge_strategy_state(tree):  # what the server keeps between rounds (DP's accountant too)
    tree["strategy"]["trained"] = {}


NOT_VERIFIED = (r"its checkpoint.pt does not verify with this machine's checkpoint key \(.*"
                r"checkpoint.key\): it was changed after driftfl wrote it, or written under "
                r"another machine's key")


@pytest.mark.parametrize("change", [negate_head, forge_best_accuracy, forge_strategy_state])
def test_a_checkpoint_changed_without_the_key_is_refused_before_anything_runs(
        change, stopped_run, tmp_path):
    run_dir = forge(copy_of(stopped_run, tmp_path), change)
    before = listing(run_dir)
    assert re.search(NOT_VERIFIED, one_line_refusal([*SMALL, f"resume={run_dir}"], tmp_path))
    assert listing(run_dir) == before  # no summary.json with the forged row, nothing launched


def flip_torch_state(tree):
    state = tree["rng"]["torch"].clone()
    state[0] ^= 1
    tree["rng"]["torch"] = state


PARTS = {  # one change in each part a resume restores or reports
    "arrays": lambda t: t["arrays"].update({k: v + 1e-3 for k, v in t["arrays"].items()}),
    "rows": lambda t: t["rows"][1].update(bytes_sent=0),
    "strategy": forge_strategy_state,
    "rng": flip_torch_state,
    "config": lambda t: t["config"].update(seed=t["config"]["seed"] + 1),
    "seconds": lambda t: t.update(seconds=t["seconds"] + 1.0),
}


@pytest.mark.parametrize("part", sorted(PARTS))
def test_every_part_of_the_checkpoint_is_under_the_tag(part, stopped_run, tmp_path):
    run_dir = forge(copy_of(stopped_run, tmp_path), PARTS[part])
    with pytest.raises(ConfigError, match=NOT_VERIFIED):
        checkpoint.check(run_dir, experiment())


def test_a_checkpoint_from_another_key_is_refused_with_what_to_do(stopped_run, tmp_path):
    run_dir = copy_of(stopped_run, tmp_path)
    key = seal.key_path()
    mine = key.read_bytes()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(mine) == 32
    assert not str(key).startswith(str(stopped_run))  # the key lives outside the run directory
    try:
        key.write_bytes(os.urandom(32))  # this machine's key is another than the writer's
        line = one_line_refusal([*SMALL, f"resume={run_dir}"], tmp_path)
        assert re.search(NOT_VERIFIED + r" \(copy that key to this path to resume it here\)",
                         line), line
        key.unlink()  # no key at all on this machine
        line = one_line_refusal([*SMALL, f"resume={run_dir}"], tmp_path)
        assert f"its checkpoint.pt cannot be verified: this machine has no checkpoint key " \
               f"({key}); it was written on another machine or by another user: copy that " \
               f"machine's key to this path" in line, line
        assert not key.exists()  # a resume makes no key: it would verify nothing
    finally:
        key.write_bytes(mine)
        key.chmod(0o600)
    assert checkpoint.check(run_dir, experiment())["round"] == 1  # the writer's key: accepted


def bomb(declared: int) -> bytes:
    """An archive whose tree member declares ``declared`` bytes of zeros, deflated to a few MB."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        with archive.open(f"{treefile.TREE}.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_2_0(member, {
                "descr": "|u1", "fortran_order": False, "shape": (declared,)})
            for _ in range(declared // 2**26):
                member.write(bytes(2**26))
    return buffer.getvalue()


def test_a_zip_bomb_is_refused_without_inflating_any_member(stopped_run, tmp_path, monkeypatch):
    """3 GB in a few MB, sealed with this machine's key (so that the size check, not the tag,
    refuses it): no member is opened, let alone inflated."""
    run_dir = copy_of(stopped_run, tmp_path)
    data = bomb(3 * 2**30)
    assert len(data) < 20 * 2**20
    (run_dir / checkpoint.CHECKPOINT).write_bytes(seal.seal(data))
    prepared = experiment()

    def never(*args, **kwargs):
        raise AssertionError("a member of the archive was opened")

    monkeypatch.setattr(zipfile.ZipFile, "open", never)
    with pytest.raises(ConfigError) as refused:
        checkpoint.check(run_dir, prepared)
    assert re.search(r"its checkpoint.pt declares 3072 MiB of arrays, more than the 1024 MiB "
                     r"it can hold here; resume another", str(refused.value)), refused.value
    monkeypatch.undo()
    line = one_line_refusal([*SMALL, f"resume={run_dir}"], tmp_path)  # and from the CLI
    assert "declares 3072 MiB of arrays" in line


def test_a_compressed_member_is_refused(stopped_run, tmp_path):
    """driftfl stores its arrays: a deflated member is no checkpoint of its, whatever its size."""
    run_dir = copy_of(stopped_run, tmp_path)
    tree = treefile.read(run_dir / checkpoint.CHECKPOINT)
    buffer = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(treefile.dumps(tree))) as plain, \
            zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as packed:
        for info in plain.infolist():
            packed.writestr(info.filename, plain.read(info))
    (run_dir / checkpoint.CHECKPOINT).write_bytes(seal.seal(buffer.getvalue()))
    with pytest.raises(ConfigError, match="has a member 'tree.npy' compressed in a way "
                                          "driftfl never writes"):
        checkpoint.check(run_dir, experiment())


def test_a_checkpoint_that_is_a_link_or_a_device_is_refused(stopped_run, tmp_path):
    run_dir = copy_of(stopped_run, tmp_path)
    path = run_dir / checkpoint.CHECKPOINT
    path.rename(tmp_path / "elsewhere.pt")
    path.symlink_to(tmp_path / "elsewhere.pt")
    with pytest.raises(ConfigError, match="its checkpoint.pt is a symbolic link; driftfl reads"):
        checkpoint.check(run_dir, experiment())
    path.unlink()
    path.symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="its checkpoint.pt is a symbolic link"):
        checkpoint.check(run_dir, experiment())


def test_saving_replaces_a_planted_link_and_leaves_its_target_alone(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / checkpoint.CHECKPOINT).symlink_to(victim)
    treefile.write(tmp_path / checkpoint.CHECKPOINT, {"round": 1}, seal.seal)
    assert victim.read_text() == "keep me"
    assert not (tmp_path / checkpoint.CHECKPOINT).is_symlink()
    assert checkpoint.read(tmp_path / checkpoint.CHECKPOINT, treefile.LIMIT) == {"round": 1}
