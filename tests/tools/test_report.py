"""`driftfl report` over run directories: grouping, mean +- std, rounds to a target, and its
checks of the options."""

from __future__ import annotations

import json

import pytest
import yaml

from driftfl.report import main as report


def write_run(folder, label, accuracies, completed=True, **config):
    """A run directory; round 1 takes 9 s, every other round 2 s, its start-up 30 s."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"label": label, "seed": 0, **config}))
    rounds = [{"round": i, "test_accuracy": a, "seconds": 9.0 if i == 1 else 2.0, "clients": 2,
               "bytes_sent": 2 * 2**20, "bytes_received": 2**20} for i, a in enumerate(accuracies)]
    (folder / "metrics.json").write_text(json.dumps({"rounds": rounds}))
    if completed:
        (folder / "summary.json").write_text(json.dumps({"status": "completed",
                                                         "startup_seconds": 30.0}))


def refused(capsys, argv) -> str:
    """The one line that refuses ``argv`` (exit code 2)."""
    with pytest.raises(SystemExit) as stop:
        report(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("driftfl report: error: ")
    return err


def test_report_groups_runs_and_races_to_the_target(tmp_path, capsys):
    write_run(tmp_path / "a0", "fedavg", [0.1, 0.5, 0.6])
    write_run(tmp_path / "a1", "fedavg", [0.1, 0.6, 0.8], seed=1)  # fedavg's mean final: 0.70
    write_run(tmp_path / "b0", "fedcsd", [0.1, 0.7, 0.9])  # reaches 0.70 in round 1
    write_run(tmp_path / "b1", "fedcsd", [0.1, 0.4, 0.75], seed=1)  # ... in round 2
    write_run(tmp_path / "c0", "broken", [0.1], completed=False)
    report([str(tmp_path), "--target", "fedavg"])
    out = capsys.readouterr().out
    assert ("| s / round from round 2 | s of start-up | MB / client / round "
            "(down, up) |") in out
    assert ("| fedavg | 2 | 2 | 70.00 ± 14.14 | 70.00 ± 14.14 | 2.0 (1 of 2) | 2.0 | 30.0 | "
            "1.00, 0.50 |") in out
    assert ("| fedcsd | 2 | 2 | 82.50 ± 10.61 | 82.50 ± 10.61 | 1.5 | 2.0 | 30.0 | "
            "1.00, 0.50 |") in out
    assert "rounds to fedavg's final acc" in out and "1 run(s) did not complete" in out
    assert "differ" not in out  # runs that differ only in the seed share a row
    for name in ("report.md", "report.csv", "report.png"):
        assert (tmp_path / name).is_file()


def test_a_single_run_has_no_spread(tmp_path, capsys):
    write_run(tmp_path / "a", "fedavg", [0.1, 0.5, 0.6])
    report([str(tmp_path)])
    assert "| fedavg | 1 | 2 | 60.00 ± - | 60.00 ± - | - | 2.0 | 30.0 |" in capsys.readouterr().out


def test_runs_of_other_experiments_under_one_label_get_their_own_rows(tmp_path, capsys):
    # the four 'fedavg' runs: 10 clients 2 rounds, 10 clients 4 rounds (two seeds, one
    # on a GPU with its own Ray cluster), and a 2-client run of 2 rounds on a deployed federation
    data = {"name": "fmnist", "download": False}
    write_run(tmp_path / "a", "fedavg", [0.1, 0.5, 0.6], rounds=2, num_clients=10, dataset=data)
    write_run(tmp_path / "b", "fedavg", [0.1, 0.5, 0.6, 0.7, 0.8], rounds=4, num_clients=10,
              dataset=data)
    write_run(tmp_path / "c", "fedavg", [0.1, 0.4, 0.6, 0.7, 0.9], rounds=4, num_clients=10,
              dataset={**data, "download": True}, seed=1, device="cuda",
              simulation={"client_gpus": 0.5, "ray_address": "auto"})
    write_run(tmp_path / "d", "fedavg", [0.1, 0.3, 0.4], rounds=2, num_clients=2, dataset=data,
              superlink="lab", verbose=True)
    write_run(tmp_path / "e", "fedcsd", [0.1, 0.7, 0.8, 0.84, 0.9], rounds=4, num_clients=10,
              dataset=data)
    report([str(tmp_path), "--target", "fedavg", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert "| fedavg (num_clients=2, rounds=2) | 1 | 2 | 40.00 ± - |" in out
    assert "| fedavg (num_clients=10, rounds=2) | 1 | 2 | 60.00 ± - |" in out
    assert "| fedavg (num_clients=10, rounds=4) | 2 | 4 | 85.00 ± 7.07 |" in out
    # fedcsd ran 4 rounds on 10 clients: it races to that fedavg row's 0.85 (round 4)
    assert "| fedcsd | 1 | 4 | 90.00 ± - | 90.00 ± - | 4.0 |" in out
    assert out.count("differ") == 1
    assert ("fedavg: the runs differ in num_clients, rounds, so each setting has its own row "
            "(--by num_clients,rounds,label makes them columns)") in out
    assert "num_clients, rounds" in (tmp_path / "out" / "report.md").read_text()


def test_a_split_row_is_named_by_the_fewest_settings_that_tell_it_apart(tmp_path, capsys):
    dirichlet = {"name": "dirichlet", "alpha": 0.1, "min_size": 10}
    pathological = {"name": "pathological", "classes_per_client": 2}
    for label in ("fedavg", "fedcsd"):
        write_run(tmp_path / label / "d", label, [0.1, 0.8], partition=dirichlet)
        write_run(tmp_path / label / "p", label, [0.1, 0.5], partition=pathological)
    report([str(tmp_path)])
    out = capsys.readouterr().out
    assert "| fedavg (partition.name=dirichlet) | 1 | 1 | 80.00 ± - |" in out
    assert "| fedcsd (partition.name=pathological) | 1 | 1 | 50.00 ± - |" in out
    assert ("fedavg, fedcsd: the runs differ in partition.name, so each setting has its own row "
            "(--by partition.name,label makes it a column)") in out


def test_each_partition_races_to_its_own_fedavg(tmp_path, capsys):
    for part, avg, csd in (("dirichlet", [0.1, 0.8], [0.1, 0.85]), ("pathological", [0.1, 0.5],
                                                                     [0.45, 0.6])):
        for label, acc in (("fedavg", avg), ("fedcsd", csd)):
            write_run(tmp_path / f"{part}-{label}", label, acc, partition={"name": part})
    report([str(tmp_path), "--by", "partition.name,label", "--target", "fedavg"])
    out = capsys.readouterr().out
    # pathological fedcsd reaches its FedAvg's 0.5 in round 1, dirichlet's only its 0.8 in 1
    assert "| pathological | fedcsd | 1 | 1 | 60.00 ± - | 60.00 ± - | 1.0 |" in out
    assert "| dirichlet | fedcsd | 1 | 1 | 85.00 ± - | 85.00 ± - | 1.0 |" in out
    # the partitions differ in partition.name, a --by key: no split
    assert "differ" not in out
    # --only shows fedcsd, still racing to the FedAvg it leaves out
    report([str(tmp_path), "--by", "partition.name,label", "--only", "fedcsd", "--target",
            "fedavg"])
    only = capsys.readouterr().out
    assert "| pathological | fedcsd | 1 | 1 | 60.00 ± - | 60.00 ± - | 1.0 |" in only
    assert "| fedavg |" not in only


def test_only_names_labels_no_run_has(tmp_path, capsys):
    write_run(tmp_path / "a", "fedavg", [0.1, 0.5])
    write_run(tmp_path / "b", "fedcsd", [0.1, 0.7])
    report([str(tmp_path), "--only", "fedcsd,fedcds"])
    captured = capsys.readouterr()
    assert captured.err.strip() == ("driftfl report: warning: --only: no run has label fedcds; "
                                    "valid: fedavg, fedcsd")
    assert "| fedcsd |" in captured.out and "| fedavg |" not in captured.out
    err = refused(capsys, [str(tmp_path), "--only", "fedcds", "--out", str(tmp_path / "o")])
    assert err.endswith("--only: no run has label fedcds; valid: fedavg, fedcsd")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("option, says", [
    (["--target", "nosuch"], "--target nosuch: no run has label nosuch; valid: fedavg, fedcsd"),
    (["--by", "partition.nme,label"], "--by partition.nme: no run's config.yaml has this "
                                      "setting; close ones: partition.name, partition"),
    (["--by", "nosuch.key"], "the settings are label, partition, seed (a section's keys"),
    (["--by", ""], "--by is empty; give comma-separated names"),
    (["--by", " , "], "--by is empty"),
    (["--only", ""], "--only is empty; give comma-separated names"),
    (["--metrics", "mask_rate"], "no run records mask_rate; the runs record bytes_received"),
    (["--out", "{tmp}/a/config.yaml"], "is a file; name a directory"),
    (["--out", "{tmp}/a/config.yaml/sub"], "cannot write the report to"),
])
def test_a_bad_option_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys,
                                                                         option, says):
    write_run(tmp_path / "a", "fedavg", [0.1, 0.5], partition={"name": "dirichlet"})
    write_run(tmp_path / "b", "fedcsd", [0.1, 0.7], partition={"name": "dirichlet"})
    err = refused(capsys, [str(tmp_path), *(o.format(tmp=tmp_path) for o in option)])
    assert says in err
    assert not (tmp_path / "report.md").exists()


def test_report_without_runs_says_so(tmp_path, capsys):
    assert "no completed run" in refused(capsys, [str(tmp_path)])
    assert "no such directory" in refused(capsys, [str(tmp_path / "nope")])


def test_a_run_with_only_round_0_is_skipped_with_a_line(tmp_path, capsys):
    write_run(tmp_path / "a", "fedavg", [0.1])
    with pytest.raises(SystemExit) as stop:
        report([str(tmp_path)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"driftfl report: warning: skipping {tmp_path / 'a'}: it has no trained "
                      "round (only round 0)")
    assert err[1].startswith("driftfl report: error: no completed run with a trained round")
    write_run(tmp_path / "b", "fedavg", [0.1, 0.5])
    report([str(tmp_path)])
    captured = capsys.readouterr()
    assert "skipping" in captured.err and "| fedavg | 1 | 1 | 50.00 ± - |" in captured.out


def add_metric(folder, metric, values):
    metrics = json.loads((folder / "metrics.json").read_text())
    for row, value in zip(metrics["rounds"], values):
        if value is not None:  # round 0 trains nothing and records no diagnostic
            row[metric] = value
    (folder / "metrics.json").write_text(json.dumps(metrics))


def test_report_averages_a_diagnostic_over_trained_rounds(tmp_path, capsys):
    write_run(tmp_path / "a", "fedavg", [0.1, 0.5, 0.6])
    write_run(tmp_path / "b", "fedcsd", [0.1, 0.7, 0.9])
    write_run(tmp_path / "c", "fedcsd", [0.1, 0.7, 0.9], seed=1)
    add_metric(tmp_path / "a", "mask_filter_rate", [None, 0.2, 0.4])
    add_metric(tmp_path / "b", "logit_shift", [None, 0.5, 0.25])
    report([str(tmp_path), "--metrics", "logit_shift,mask_filter_rate"])
    out = capsys.readouterr().out
    assert "| mean logit_shift | mean mask_filter_rate |" in out
    # fedcsd's seed 1 records no shift: the mean is over the one run that does, and says so
    assert "| fedcsd | 2 | 2 |" in out and "| 1.00, 0.50 | 0.375 (1 of 2) | - |" in out
    assert "| fedavg | 1 | 2 |" in out and "| 1.00, 0.50 | - | 0.300 |" in out
    assert "logit_shift is missing from 1 row(s), whose runs do not record it: fedavg" in out
    assert "mask_filter_rate is missing from 1 row(s), whose runs do not record it: fedcsd" in out
    # the rows shown lack it, another run has it: the report goes on
    report([str(tmp_path), "--metrics", "logit_shift", "--only", "fedavg"])
    assert "logit_shift is missing from 1 row(s)" in capsys.readouterr().out


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
    assert "| fedavg | 1 | 2 | 60.00 ± - |" in captured.out and "fedcsd" not in captured.out
    for name in ("report.md", "report.csv", "report.png"):
        assert (tmp_path / name).is_file()


def test_a_round_with_missing_fields_does_not_stop_the_report(tmp_path, capsys):
    write_run(tmp_path / "a", "fedavg", [0.1, 0.5, 0.6])
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    for row in metrics["rounds"]:
        del row["clients"], row["seconds"]  # written by another version, or edited
    (tmp_path / "a" / "metrics.json").write_text(json.dumps(metrics))
    (tmp_path / "a" / "summary.json").write_text('{"status": "completed"}')  # no start-up
    report([str(tmp_path)])
    assert "| fedavg | 1 | 2 | 60.00 ± - | 60.00 ± - | - | - | - | - |" in capsys.readouterr().out


def test_per_client_columns_are_the_last_evaluated_round_as_mean_and_std_over_seeds(
        tmp_path, capsys):
    for seed, (mean, worst) in enumerate([(0.6, 0.2), (0.8, 0.4)]):
        folder = tmp_path / f"s{seed}"
        write_run(folder, "fedavg", [0.1, 0.5, 0.6], seed=seed)
        rounds = json.loads((folder / "metrics.json").read_text())["rounds"]
        for row in rounds[1:]:  # rounds 1 and 2; round 2 is the last evaluated
            scale = row["round"] / 2
            row.update({f"client_acc_{p}_{s}": v * scale for p in ("before", "after")
                        for s, v in (("mean", mean), ("std", 0.1), ("worst10", worst),
                                     ("best", 0.9))})
        (folder / "metrics.json").write_text(json.dumps({"rounds": rounds}))
    write_run(tmp_path / "other", "fedprox", [0.1, 0.5, 0.6])  # measured none
    report([str(tmp_path)])
    out = capsys.readouterr().out
    assert "| client acc after mean (%) | client acc after std (%) |" in out
    # after: mean of 60 and 80 = 70 ± 14.14; std 10 ± 0; worst10 30 ± 14.14; best 90 ± 0
    assert "| 70.00 ± 14.14 | 10.00 ± 0.00 | 30.00 ± 14.14 | 90.00 ± 0.00 |" in out
    assert out.count("| - | - | - | - | - | - | - | - |") == 1  # fedprox's row
    assert (tmp_path / "clients.png").is_file()
