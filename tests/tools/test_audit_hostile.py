"""`driftfl audit` on a run directory someone else made: arrays bounded by the shapes they
declare before any is loaded, no write through a symbolic link, no file's contents echoed, no
read of a device or an endless file. Each: one line, exit code 2, nothing written."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from driftfl import audit
from test_leakage import run_dir  # noqa: F401  (the hand-built DCFL run directory)

pytestmark = pytest.mark.slow  # the run directory rebuilds a partition of Fashion-MNIST

SECRET = "password: hunter2"


def refused(capsys, run_dir) -> str:
    with pytest.raises(SystemExit) as stopped:
        audit.main([str(run_dir)])
    assert stopped.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("driftfl: error: "), err
    assert not (run_dir / "audit.json").exists() or (run_dir / "audit.json").is_symlink()
    assert not list((run_dir / "images").glob("pairs_client_*.png")) or all(
        p.is_symlink() for p in (run_dir / "images").glob("pairs_client_*.png"))
    return err


def declaring(path, x_shape, deflated=True) -> None:
    """A client_<id>.npz whose x declares ``x_shape`` uint8 zeros (a few MB, deflated)."""
    count = int(np.prod(x_shape))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        with archive.open("x.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(member, {
                "descr": "|u1", "fortran_order": False, "shape": tuple(x_shape)})
            for start in range(0, count, 2**26):
                member.write(bytes(min(2**26, count - start)))
        buffer = io.BytesIO()
        np.save(buffer, np.zeros(x_shape[0], np.int64))
        archive.writestr("y.npy", buffer.getvalue())


@pytest.mark.parametrize("x_shape, says", [
    ((2_000_000, 28, 28), "declares 1511 MiB of arrays, more than the 64 MiB it can hold here"),
    ((20_000, 2, 2), "declares 20000 images, more than the 10000 a client's shipped set may "
                     "hold"),
    ((10, 784), "declares images of shape [10, 784] and labels of shape [10]"),
])
def test_a_set_is_bounded_by_its_declared_shapes_before_it_is_loaded(
        x_shape, says, run_dir, capsys, monkeypatch):
    path = run_dir / "images" / "client_0.npz"
    declaring(path, x_shape)
    monkeypatch.setattr(np, "load", lambda *a, **k: pytest.fail("an array was loaded"))
    err = refused(capsys, run_dir)
    assert err.startswith(f"driftfl: error: {path} {says}"), err


@pytest.mark.parametrize("link", ["audit.json", "images/pairs_client_1.png", "images"])
def test_audit_never_writes_through_a_symbolic_link(link, run_dir, tmp_path, capsys):
    victim = tmp_path / "victim"
    if link == "images":  # the folder itself: its sets moved to the victim folder
        (run_dir / "images").rename(victim)
    else:
        victim.write_text("keep me")
    (run_dir / link).symlink_to(victim)
    err = refused(capsys, run_dir)
    assert f"{run_dir / link} is a symbolic link; driftfl never writes through one" in err
    if link != "images":
        assert victim.read_text() == "keep me"
    else:
        assert not list(victim.glob("pairs_client_*.png"))


def test_no_line_of_a_linked_or_broken_config_is_echoed(run_dir, tmp_path, capsys):
    secret = tmp_path / "secret.yaml"
    secret.write_text(f"{SECRET}\n  : [unclosed\n")
    config = run_dir / "config.yaml"
    config.unlink()
    config.symlink_to(secret)
    err = refused(capsys, run_dir)
    assert f"{config} is a symbolic link; driftfl reads no file" in err and "hunter2" not in err

    config.unlink()
    config.write_text(secret.read_text())  # the broken file itself: where, not what
    err = refused(capsys, run_dir)
    assert err == f"driftfl: error: cannot read {config}: not YAML (line 2)\n", err


@pytest.mark.parametrize("name", ["config.yaml", "partition.json", "images/client_0.npz"])
def test_a_device_or_an_endless_file_is_refused_unread(name, run_dir, capsys):
    path = run_dir / name
    path.unlink()
    path.symlink_to("/dev/zero")
    err = refused(capsys, run_dir)
    assert f"{path} is a symbolic link" in err, err


def test_a_file_beyond_the_cap_is_refused_unread(run_dir, capsys, monkeypatch):
    from driftfl.common import untrusted

    monkeypatch.setattr(untrusted.read_text, "__defaults__", (1000,))  # a cap this config passes
    assert (run_dir / "config.yaml").stat().st_size > 1000
    err = refused(capsys, run_dir)
    assert err.startswith(f"driftfl: error: {run_dir / 'config.yaml'} holds more than 1000 "
                          "bytes, more than driftfl ever writes there"), err
