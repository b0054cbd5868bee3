"""`driftfl report` over run directories: grouping, mean +- std, rounds to a target."""

from __future__ import annotations

import json

import pytest
import yaml

from driftfl.report import main as report


def write_run(folder, label, accuracies, completed=True, seconds=2.0):
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"label": label, "seed": 0}))
    rounds = [{"round": i, "test_accuracy": a, "seconds": seconds, "clients": 2,
               "bytes_sent": 2 * 2**20, "bytes_received": 2**20} for i, a in enumerate(accuracies)]
    (folder / "metrics.json").write_text(json.dumps({"rounds": rounds}))
    if completed:
        (folder / "summary.json").write_text(json.dumps({"status": "completed"}))


def test_report_groups_runs_and_races_to_the_target(tmp_path, capsys):
    write_run(tmp_path / "a0", "fedavg", [0.1, 0.5, 0.6])
    write_run(tmp_path / "a1", "fedavg", [0.1, 0.6, 0.8])  # fedavg's mean final: 0.70
    write_run(tmp_path / "b0", "fedcsd", [0.1, 0.7, 0.9])  # reaches 0.70 in round 1
    write_run(tmp_path / "b1", "fedcsd", [0.1, 0.4, 0.75])  # ... in round 2
    write_run(tmp_path / "c0", "broken", [0.1], completed=False)
    report([str(tmp_path), "--target", "fedavg"])
    out = capsys.readouterr().out
    assert "| fedavg | 2 | 2 | 70.00 ± 14.14 | 70.00 ± 14.14 | 2.0 (1 of 2) | 2.0 | 1.00, 0.50 |" in out
    assert "| fedcsd | 2 | 2 | 82.50 ± 10.61 | 82.50 ± 10.61 | 1.5 | 2.0 | 1.00, 0.50 |" in out
    assert "rounds to fedavg's final acc" in out and "1 run(s) did not complete" in out
    for name in ("report.md", "report.csv", "report.png"):
        assert (tmp_path / name).is_file()


def test_report_without_runs_says_so(tmp_path):
    with pytest.raises(SystemExit, match="no completed run"):
        report([str(tmp_path)])
    with pytest.raises(SystemExit, match="no such directory"):
        report([str(tmp_path / "nope")])


def test_each_partition_races_to_its_own_fedavg(tmp_path, capsys):
    for part, avg, csd in (("dirichlet", [0.1, 0.8], [0.1, 0.85]), ("pathological", [0.1, 0.5],
                                                                     [0.45, 0.6])):
        for label, acc in (("fedavg", avg), ("fedcsd", csd)):
            write_run(tmp_path / f"{part}-{label}", label, acc)
            path = tmp_path / f"{part}-{label}" / "config.yaml"
            path.write_text(yaml.safe_dump({"label": label, "partition": {"name": part}}))
    report([str(tmp_path), "--by", "partition.name,label", "--target", "fedavg"])
    out = capsys.readouterr().out
    report([str(tmp_path), "--by", "partition.name,label", "--only", "fedcsd"])
    only = capsys.readouterr().out
    assert "fedcsd" in only and "| fedavg |" not in only
    # pathological fedcsd reaches its FedAvg's 0.5 in round 1, dirichlet's only its 0.8 in 1
    assert "| pathological | fedcsd | 1 | 1 | 60.00 ± 0.00 | 60.00 ± 0.00 | 1.0 |" in out
    assert "| dirichlet | fedcsd | 1 | 1 | 85.00 ± 0.00 | 85.00 ± 0.00 | 1.0 |" in out


def test_report_averages_a_diagnostic_over_trained_rounds(tmp_path, capsys):
    write_run(tmp_path / "a", "fedavg", [0.1, 0.5, 0.6])
    write_run(tmp_path / "b", "fedcsd", [0.1, 0.7, 0.9])
    metrics = json.loads((tmp_path / "b" / "metrics.json").read_text())
    for row, shift in zip(metrics["rounds"], [None, 0.5, 0.25]):
        if shift is not None:  # round 0 trains nothing and records no shift
            row["logit_shift"] = shift
    (tmp_path / "b" / "metrics.json").write_text(json.dumps(metrics))
    report([str(tmp_path), "--metrics", "logit_shift"])
    out = capsys.readouterr().out
    assert "| mean logit_shift |" in out
    assert out.count("| 0.375 |") == 1 and "| 1.00, 0.50 | - |" in out  # fedavg has none
    with pytest.raises(SystemExit, match="no run records mask_rate; the runs record .*logit_shift"):
        report([str(tmp_path), "--metrics", "mask_rate"])


def test_unreadable_run_is_skipped_with_one_warning(tmp_path, capsys):
    write_run(tmp_path / "a", "fedavg", [0.1, 0.5, 0.6])
    write_run(tmp_path / "b", "fedavg", [0.1, 0.6, 0.8])
    write_run(tmp_path / "c", "fedcsd", [0.1, 0.7, 0.9])
    metrics = tmp_path / "b" / "metrics.json"
    metrics.write_text(metrics.read_text()[:40])  # cut off mid-write
    (tmp_path / "c" / "summary.json").write_text('{"status": "compl')
    report([str(tmp_path)])
    captured = capsys.readouterr()
    warnings = captured.err.splitlines()
    assert len(warnings) == 2
    assert warnings[0].startswith(f"driftfl report: warning: skipping {tmp_path / 'b'}: cannot "
                                  "read metrics.json (")
    assert warnings[1].startswith(f"driftfl report: warning: skipping {tmp_path / 'c'}: cannot "
                                  "read summary.json (")
    assert "| fedavg | 1 | 2 | 60.00 ± 0.00 |" in captured.out and "fedcsd" not in captured.out
    for name in ("report.md", "report.csv", "report.png"):
        assert (tmp_path / name).is_file()
