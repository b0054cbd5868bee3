"""Real Flower in local Ray simulation, on real Fashion-MNIST: `driftfl run` (one run and a
sweep) and plain `flwr run` over the same conf/ tree.

The runs submit to the session's simulation host (conftest.simulation_host: one Ray and one
SuperLink), as a sweep's jobs do; starting and stopping a host of a run's own is what
test_stopping_driftfl_run_stops_every_process_it_started, test_e2e_orphans.py,
test_e2e_failures.py and test_e2e_sweep.py prove."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import REPO, driftfl_bin
from support.runs import QUICK, assert_learned, read_rounds
from driftfl.common.paths import console_script
from driftfl.host import CONNECTION, HOST_ENV, flwr_env

pytestmark = pytest.mark.e2e
def test_driftfl_run_trains_and_writes_the_run_directory(tmp_path, fmnist_available,
                                                         simulation_host):
    run_dir = tmp_path / "run"
    out = subprocess.run([driftfl_bin(), "run", *QUICK, f"hydra.run.dir={run_dir}"],
                         cwd=tmp_path, env=simulation_host, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # progress: the data table, one line per round with accuracy and time, a summary
    assert "clients' data (fedavg on fmnist, Dirichlet(0.5), 4 clients, mlp)" in out.stdout
    assert "round   2/2  test acc" in out.stdout and "driftfl: 2 rounds in" in out.stdout
    # the start-up (the SuperLink, Ray, the clients' first message) once, before round 0: no
    # round's train time holds it
    lines = out.stdout.splitlines()
    [startup] = [i for i, line in enumerate(lines) if line.startswith("driftfl: start-up ")]
    assert lines[startup + 1].startswith("round   0/2")
    # only driftfl's own lines: Flower's and Ray's notices need verbose=true
    own = re.compile(r"^(clients' data \(|client +n |\s+\d+\s+\d+|round +\d+/\d+ |driftfl: |"
                     r"results: )")
    assert [line for line in (out.stdout + out.stderr).splitlines()
            if not own.match(line)] == [], out.stdout + out.stderr

    rows = assert_learned(run_dir)
    for name in ("config.yaml", "meta.json", "metrics.csv", "partition.json", "model.pt",
                 "accuracy.png", "summary.json", "clients.csv", "partition.png", "per_class.png"):
        assert (run_dir / name).is_file(), name
    # every client accepted in every round: clients.png would draw equal bars, so is not drawn
    assert not (run_dir / "clients.png").exists()
    trained = rows[1]
    # every client trained on the partition the server assigned it: a reply claiming more
    # examples than its partition holds would have been rejected
    assert trained["clients"] == 4 and trained["num_examples"] == 4000
    assert trained["rejected"] == 0
    assert trained["bytes_sent"] > 4 * 4 * 199_210  # 4 copies of the mlp's float32 weights
    # by payload kind: the model and the config out, the model and the metrics back
    assert trained["bytes_down_arrays"] + trained["bytes_down_config"] == trained["bytes_sent"]
    assert trained["bytes_up_arrays"] + trained["bytes_up_metrics"] == trained["bytes_received"]
    assert trained["bytes_up_arrays"] == trained["bytes_down_arrays"]  # the same model, 4 times
    assert rows[0]["bytes_sent"] == 0  # a simulation has no data survey: the server assigns
    assert len(trained["per_class_accuracy"]) == 10
    header = (run_dir / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"round", "test_accuracy", "test_loss", "seconds", "bytes_sent", "bytes_received",
            "bytes_up_arrays", "bytes_down_config", "acc_class_0", "acc_class_9",
            "train_loss"} <= set(header)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["bytes_up_arrays"] == sum(r.get("bytes_up_arrays", 0) for r in rows)
    assert summary["startup_seconds"] > 0 and "seconds_before_resume" not in summary

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["dataset"]["subset"] == 4000 and config["strategy"]["name"] == "fedavg"
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["versions"]["flwr"] and meta["git_revision"]
    partition = json.loads((run_dir / "partition.json").read_text())
    assert sorted(c["partition_id"] for c in partition["clients"]) == [0, 1, 2, 3]
    assert sum(sum(c["label_histogram"]) for c in partition["clients"]) == 4000

    from driftfl.common.models import build_model

    model = build_model(config["model"], (1, 28, 28), 10)
    # the final model loads back
    model.load_state_dict(torch.load(run_dir / "model.pt", weights_only=True))


def test_a_partition_that_leaves_classes_unheld_warns_and_says_so_in_the_summary(
        tmp_path, fmnist_available, simulation_host):
    """4 clients x 2 classes cannot hold Fashion-MNIST's 10: the run says which it lost."""
    run_dir = tmp_path / "run"
    out = subprocess.run([driftfl_bin(), "run", *QUICK, "rounds=1", "partition=pathological",
                          f"hydra.run.dir={run_dir}"],
                         cwd=tmp_path, env=simulation_host, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    warnings = [line for line in out.stdout.splitlines()
                if line.startswith("driftfl: warning: the partition leaves class(es)")]
    assert len(warnings) == 1, out.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    unheld = summary["classes_without_client"]
    assert len(unheld) == 2 and summary["clients_without_sample"] == []
    assert all(f"{c} (" in warnings[0] for c in unheld)
    held = {c for client in json.loads((run_dir / "partition.json").read_text())["clients"]
            for c, n in enumerate(client["label_histogram"]) if n}
    assert held == set(range(10)) - set(unheld)
    assert all(read_rounds(run_dir)[-1]["per_class_accuracy"][c] == 0 for c in unheld)


def test_resume_alone_goes_on_with_the_runs_own_settings_for_more_rounds(
        tmp_path, fmnist_available, simulation_host):
    """A finished run of 1 round, then `resume=DIR rounds=2` alone: the run's own overrides,
    one more round, and a summary that keeps the parts' times apart; another setting is
    refused in one line naming it."""
    run_dir = tmp_path / "run"
    first = subprocess.run([driftfl_bin(), "run", *QUICK, "rounds=1", f"hydra.run.dir={run_dir}"],
                           cwd=tmp_path, env=simulation_host, capture_output=True, text=True,
                           timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    out = subprocess.run([driftfl_bin(), "run", f"resume={run_dir}", "rounds=2"], cwd=tmp_path,
                         env=simulation_host, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"driftfl: resuming {run_dir} after round 1 of 2" in out.stdout
    assert "driftfl: round 2 in " in out.stdout and "(round 1: " in out.stdout
    rows = assert_learned(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_after_round"] == 1 and summary["rounds"] == 2
    assert summary["seconds_before_resume"] > 0 and summary["startup_seconds"] > 0
    assert rows[1]["num_examples"] == rows[2]["num_examples"] == 4000  # QUICK's subset again
    refused = subprocess.run([driftfl_bin(), "run", f"resume={run_dir}", "rounds=3", "lr=0.1"],
                             cwd=tmp_path, env=simulation_host, capture_output=True, text=True,
                             timeout=600)
    assert refused.returncode == 2 and refused.stderr.startswith(
        f"driftfl: error: cannot resume {run_dir}: its experiment differs in lr (0.05 there, "
        "0.1 here); a resumed run keeps the settings it ran with")


def test_plain_flwr_run_reads_the_same_conf_tree(tmp_path, fmnist_available, simulation_host):
    """What a user of Flower's own CLI does: flwr run . <connection> --run-config ..., with
    Flower's usual keys beside the overrides, here to the session's simulation SuperLink (a
    `flower-superlink --simulation` as driftfl.host starts it). Flower's default federation
    (2 nodes) for 4 clients is refused at once, in one line, instead of waiting node_wait."""
    run_dir = tmp_path / "flwr-run"
    env = flwr_env(simulation_host[HOST_ENV])
    overrides = " ".join(["strategy.mu=0.01", *QUICK]).replace("rounds=2", "")
    command = [console_script("flwr"), "run", str(REPO), CONNECTION, "--stream", "--run-config",
               f"overrides='{overrides}' run-dir='{run_dir}' num-server-rounds=2 "
               "strategy='fedprox'"]
    # Flower's default asks 2 CPUs a client; the session's host counts one (conftest)
    one_cpu = "client_resources_num_cpus=1"
    started = time.monotonic()
    too_few = subprocess.run([*command, "--federation-config", one_cpu], env=env,
                             capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - started
    out = subprocess.run([*command, "--federation-config", f"num_supernodes=4 {one_cpu}"],
                         env=env, capture_output=True, text=True, timeout=600)
    refusal = [line for line in too_few.stdout.splitlines() if "driftfl: error:" in line]
    assert refusal and refusal[0].endswith(
        'this simulation has 2 SuperNodes but num_clients=4; give flwr run --federation-config '
        '"num_supernodes=4" (or set num_clients=2)'), too_few.stdout[-3000:]
    assert "Traceback" not in too_few.stdout + too_few.stderr, too_few.stdout[-3000:]
    assert seconds < 120, seconds  # not node_wait's 600 s
    assert "round   2/2" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    assert_learned(run_dir)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["strategy"] == {"name": "fedprox", "objective": "prox", "mu": 0.01}
    assert config["rounds"] == 2


def test_stopping_driftfl_run_stops_every_process_it_started(tmp_path, fmnist_available):
    """A SIGTERM to `driftfl run` mid-run leaves no SuperLink, simulation or Ray process."""
    import psutil

    proc = subprocess.Popen([driftfl_bin(), "run", *QUICK, "rounds=50",
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:  # wait until training is under way
        if line.startswith("round   1/50"):
            break
    started = psutil.Process(proc.pid).children(recursive=True)
    names = " ".join(" ".join(p.cmdline()) for p in started)
    assert "flower-superlink" in names and "flwr-simulation" in names
    proc.terminate()
    assert proc.wait(timeout=120) != 0
    _, alive = psutil.wait_procs(started, timeout=30)
    assert not alive, [" ".join(p.cmdline()) for p in alive]


def recomputed_epsilons(run_dir: Path, delta: float = 1e-5) -> list[float]:
    """Each round's epsilon recomputed by dp-accounting alone from metrics.csv's own dp_sigma,
    dp_sigma_payload and dp_q columns (what docs/privacy.md tells a reader to do)."""
    import csv

    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    out = []
    with open(run_dir / "metrics.csv", newline="") as f:
        for row in list(csv.DictReader(f))[1:]:
            sigmas = [float(row[k]) for k in ("dp_sigma", "dp_sigma_payload", "dp_sigma_count")
                      if row.get(k)]
            event = dp_accounting.ComposedDpEvent(
                [dp_accounting.GaussianDpEvent(s) for s in sigmas])
            q = float(row["dp_q"])
            accountant.compose(event if q >= 1 else dp_accounting.PoissonSampledDpEvent(q, event))
            out.append(accountant.get_epsilon(delta))
    return out


def test_a_private_run_reports_epsilon_and_stops_at_its_budget(tmp_path, fmnist_available,
                                                               simulation_host):
    """privacy=distributed through real Flower, without SecAgg+: each round's epsilon is
    accounted for what the server sees, one noise share (sigma / sqrt(m_min) = 0.3 / 2), with
    no amplification; metrics.csv's epsilon is dp-accounting's figure from its own dp_sigma and
    dp_q; the budget stops the run before the round that would exceed it, in one line, and the
    run still completes with what it trained."""
    run_dir = tmp_path / "run"
    out = subprocess.run([driftfl_bin(), "run", *QUICK, "rounds=3", "privacy=distributed",
                          "privacy.noise_multiplier=0.3", "privacy.target_epsilon=100",
                          f"hydra.run.dir={run_dir}"],
                         cwd=tmp_path, env=simulation_host, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = read_rounds(run_dir)
    epsilons = [r["epsilon"] for r in rows]
    assert [r["round"] for r in rows] == [0, 1, 2] and epsilons[0] == 0
    assert all(r["clients"] == 4 and r["rejected"] == 0 for r in rows[1:])
    assert [r["dp_q"] for r in rows[1:]] == [1.0, 1.0]  # the server knows the sample
    assert [r["dp_sigma"] for r in rows[1:]] == pytest.approx([0.15, 0.15])
    assert epsilons[1:] == pytest.approx(recomputed_epsilons(run_dir), rel=1e-9)
    assert epsilons[2] == pytest.approx(87.8, abs=0.05)
    assert "driftfl: round 3 would spend epsilon 120 at delta 1e-05, past privacy." \
           "target_epsilon=100; the run stops after round 2" in out.stdout, out.stdout[-3000:]
    assert "driftfl: 2 rounds in" in out.stdout
    assert "privacy: distributed DP-FedAvg: each client clips its update to C = 1" in out.stdout
    assert "Without secagg=secaggplus the server sees each client's update" in out.stdout
    assert f"DP distributed, epsilon {epsilons[2]:.3g}: update norm " in out.stdout
    # 4 shares of 0.3 / sqrt(4) on their mean: 0.075 per coordinate of the mlp's 199,210,
    # against C / sqrt(d) = 0.00224; m ceil(0.8 m) >= 0.3^2 x 199210 = 17929 first at m = 150
    assert [r["dp_noise_norm"] for r in rows[1:]] == pytest.approx([0.075 * 199_210 ** 0.5] * 2)
    assert "privacy: warning: the noise per coordinate of a round's update, sigma C / " \
           "sqrt(m m_min) = 0.3 x 1 / sqrt(4 x 4) = 0.075" in out.stdout
    assert "it needs m >= 150 clients a round (now 4)" in out.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["dp_last_round"]["round"] == 2 and "dp_median_norm" not in rows[1]
    assert summary["status"] == "completed" and summary["rounds_run"] == 2
    assert summary["epsilon"] == epsilons[2] and summary["delta"] == 1e-5
    header = (run_dir / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "epsilon" in header and "train_loss" not in header  # the clients kept their loss


def test_driftfl_run_with_secaggplus_trains_through_flowers_secure_aggregation(
        tmp_path, fmnist_available, simulation_host):
    """secagg=secaggplus with privacy=distributed in a real simulation, with SCAFFOLD: every
    round's training runs through SecAgg+'s four stages; the clients clip and noise their
    updates and their control deltas, and the server receives masked vectors, never a model
    or a control delta (no array comes back), yet c moves. (secagg alone runs through real
    SuperNodes in test_e2e_deployment.py.)"""
    run_dir = tmp_path / "run"
    out = subprocess.run([driftfl_bin(), "run", "secagg=secaggplus", "privacy=distributed",
                          "strategy=scaffold", "privacy.noise_multiplier=0.01", "model=mlp",
                          "dataset.subset=2000", "dataset.test_subset=1000", "num_clients=3",
                          "rounds=2", f"hydra.run.dir={run_dir}"],
                         cwd=tmp_path, env=simulation_host, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "privacy: distributed DP-FedAvg" in out.stdout
    assert "SecAgg+ shows the server only the sum" in out.stdout
    assert "SCAFFOLD's control deltas clipped to privacy.payload_clip=" in out.stdout
    assert "|  secagg+ 3 clients, " in out.stdout and "DP distributed, secagg+" not in out.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    rows = read_rounds(run_dir)
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.2
    for row in rows[1:]:
        assert row["clients"] == 3 and row["model_updated"] == 1 and row["rejected"] == 0
        assert row.get("bytes_up_arrays", 0) == 0 and row["bytes_up_other"] > 0  # masked
        assert row["num_examples"] == 2000  # the metrics, in the clear
        assert row["server_control_norm"] > 0  # c moved by the secure sum of the deltas
    assert 0 < rows[1]["epsilon"] < rows[2]["epsilon"]
    # no amplification credited; the update's and the payload's releases composed
    assert [r["dp_q"] for r in rows[1:]] == [1.0, 1.0]
    assert [r["dp_sigma"] for r in rows[1:]] == [r["dp_sigma_payload"] for r in rows[1:]]
    assert [r["epsilon"] for r in rows[1:]] == pytest.approx(recomputed_epsilons(run_dir),
                                                             rel=1e-9)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["secagg"]["name"] == "secaggplus"


def test_per_client_evaluation_and_drawn_epochs_in_a_real_run(tmp_path, fmnist_available,
                                                              simulation_host):
    """client_test_fraction and heterogeneity=epochs through real Flower: every reply's step
    count follows its drawn epochs and is accepted, and each client's held-out figures land in
    clients.csv and the row's spread columns."""
    run_dir = tmp_path / "run"
    out = subprocess.run([driftfl_bin(), "run", "model=mlp", "dataset.subset=2000",
                          "dataset.test_subset=1000", "num_clients=3", "rounds=2",
                          "strategy=fednova", "client_test_fraction=0.2", "heterogeneity=epochs",
                          "heterogeneity.max_epochs=3", f"hydra.run.dir={run_dir}"],
                         cwd=tmp_path, env=simulation_host, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = read_rounds(run_dir)
    partition = json.loads((run_dir / "partition.json").read_text())
    trains_on = sum(c["num_examples"] for c in partition["clients"])
    assert 1590 <= trains_on <= 1610  # 20 % of each client's 2000 / 3 held out
    for row in rows[1:]:
        assert row["clients"] == 3 and row["rejected"] == 0 and row["dropped_partitions"] == ""
        assert row["num_examples"] == trains_on
        for phase in ("before", "after"):
            assert (0 <= row[f"client_acc_{phase}_worst10"] <= row[f"client_acc_{phase}_mean"]
                    <= row[f"client_acc_{phase}_best"] <= 1)
    assert rows[2]["client_acc_before_mean"] > 0.3  # round 2 starts from a trained model
    figures = (run_dir / "clients.csv").read_text().splitlines()
    assert figures[0] == "round,client,examples,outcome,acc_before,acc_after"
    assert len(figures) == 1 + 2 * 3 and all(",accepted,0." in f for f in figures[1:])
    assert (run_dir / "clients.png").is_file()
