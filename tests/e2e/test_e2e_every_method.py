"""Every method through real Flower in local Ray simulation, on real Fashion-MNIST: one sweep
of quick runs (support.runs.QUICK), one job per method, each in its own directory, and DCFL
beside it, all submitted to the session's simulation host."""

from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pytest
import yaml
from conftest import driftfl_bin
from support.runs import QUICK, assert_learned

from driftfl.methods import METHODS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]  # the first test starts the sweep
DCFL_ITERATIONS = 100


@pytest.fixture(scope="module")
def swept(tmp_path_factory, fmnist_available, simulation_host):
    """Every method but DCFL as a job of one sweep (Hydra's joblib launcher, three at a time:
    each job's own start-up overlaps the others'), and DCFL beside it as a run
    of its own with 100 condensation iterations instead of 1,000 (the default's condensation
    and what it ships are measured by tests/dcfl and benchmarks/condense_leakage.py; here,
    what a DCFL run writes and prints). Both submit to the session's host, whose runs take
    turns (driftfl.host.SimulationHost.turn). The sweep's directory, and DCFL's console."""
    root = tmp_path_factory.mktemp("every-method")
    sweep = root / "sweep"
    others = [name for name in METHODS if name != "dcfl"]
    alone = subprocess.Popen([driftfl_bin(), "run", "strategy=dcfl", *QUICK,
                              f"strategy.condense_iterations={DCFL_ITERATIONS}",
                              f"hydra.run.dir={sweep / 'dcfl'}"],
                             cwd=root, env=simulation_host, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    out = subprocess.run([driftfl_bin(), "run", "-m", f"strategy={','.join(others)}", *QUICK,
                          "hydra/launcher=joblib", "hydra.launcher.n_jobs=3",
                          f"hydra.sweep.dir={sweep}"],
                         cwd=root, env=simulation_host, capture_output=True, text=True,
                         timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    said = alone.communicate(timeout=900)
    assert alone.returncode == 0, said[0][-3000:] + said[1][-3000:]
    return sweep, said[0] + said[1]


def test_a_dcfl_runs_console_shows_driftfls_lines_each_once(swept):
    """The clients' lines come without Ray's "(ClientAppActor pid=...)" prefix and none is
    folded into "[repeated Nx across cluster]"; each client's similarity line comes once,
    from the audit after the run."""
    _, console = swept
    assert not re.search(r"pid=\d+|repeated \d+x|\x1b\[36m", console), console
    assert re.search(r"^DCFL: condensing costs each explored client about \d+ s once \(dm "
                     rf"from noise, {DCFL_ITERATIONS} iterations", console, re.M), console[:3000]
    for client in range(4):
        assert len(re.findall(rf"client {client}: \d+ of \d+ shipped images", console)) == 1
        assert re.search(rf"^condense: client {client} iteration {DCFL_ITERATIONS}/"
                         rf"{DCFL_ITERATIONS}, ", console, re.M)


def test_sweep_runs_every_method_in_its_own_directory(swept):
    sweep, _ = swept
    jobs = {}
    for job in sweep.iterdir():
        if (job / "config.yaml").exists():
            jobs[yaml.safe_load((job / "config.yaml").read_text())["strategy"]["name"]] = job
    assert sorted(jobs) == sorted(METHODS)
    rows = {name: assert_learned(job) for name, job in jobs.items()}
    assert all(r[1]["logit_shift"] > 0 for r in rows.values())  # every client measures it

    # FedCSD: its diagnostics, and the two exchanges a round costs in bytes
    csd, avg = rows["fedcsd"], rows["fedavg"]
    for row in csd[1:]:
        assert 0 <= row["mask_filter_rate"] <= 1 and 0 < row["teacher_accuracy"] < 1
        assert row["teacher_logits_reused"] == 1  # one teacher forward pass per round
    assert csd[1]["mask_filter_rate"] > csd[-1]["mask_filter_rate"]  # the teacher improves
    assert csd[1]["bytes_sent"] > 2.9 * avg[1]["bytes_sent"]  # teacher in query and train
    assert "teacher_accuracy" in rows["fedgkd"][2] and "mask_filter_rate" not in avg[1]

    # FedSSD: the credibility matrix of every round is kept; FedCAD: alpha per class
    assert all(0 < r["credibility_diag_mean"] <= 1 for r in rows["fedssd"][1:])
    with np.load(jobs["fedssd"] / "credibility.npz") as matrices:
        assert sorted(matrices.files) == ["round_1", "round_2"]
        assert np.allclose(matrices["round_2"].sum(axis=1), 1.0)
    held = json.loads((jobs["fedssd"] / "partition.json").read_text())["aux_set"]
    assert held["label_histogram"] == [64] * 10
    for row in rows["fedcad"][1:]:
        known = [a for a in row["class_alpha"] if a is not None]
        assert known and all(0.25 <= a <= 0.5 for a in known)

    # DCFL: pre-trained on condensed sets, every client explored by round 1 (fraction 1.0),
    # complementary images sent in round 2, the condensed sets and the CKA matrix kept
    dcfl = rows["dcfl"]
    assert 0.1 < dcfl[1]["pretrain_accuracy"] < 1 and dcfl[1]["explored_total"] == 4
    assert dcfl[1]["condensed_bytes_received"] > 0 and dcfl[2]["condensed_bytes_sent"] > 0
    assert dcfl[2]["exploited"] and dcfl[2]["bytes_sent"] > avg[2]["bytes_sent"]
    # each shipped set as a picture, as arrays in pixel scale, and paired with its nearest
    # real image by the audit `driftfl run` runs after a run that shipped images
    assert sorted(p.name for p in (jobs["dcfl"] / "images").iterdir()) == sorted(
        f"{stem}client_{i}.{ext}" for i in range(4)
        for stem, ext in (("", "png"), ("", "npz"), ("pairs_", "png")))
    with np.load(jobs["dcfl"] / "images" / "client_0.npz") as shipped:
        assert shipped["x"].dtype == np.uint8 and shipped["x"].shape[1:] == (28, 28)
        assert len(shipped["y"]) == len(shipped["x"])
    leakage = json.loads((jobs["dcfl"] / "summary.json").read_text())["condensed_leakage"]
    assert sorted(leakage["clients"]) == ["0", "1", "2", "3"]
    assert leakage == json.loads((jobs["dcfl"] / "audit.json").read_text())
    # no near-copies shipped, and each client's own measure, sent with its set, agrees with
    # the audit's, made from the data after the run
    assert leakage["overall"]["share"] <= 0.05
    own = {name.removeprefix("client_"): median for row in dcfl
           for name, median in row.get("condensed_similarity", {}).items()}
    assert sorted(own) == ["0", "1", "2", "3"]
    for client, median in own.items():
        assert median == pytest.approx(leakage["clients"][client]["median"], abs=1e-3)
    with np.load(jobs["dcfl"] / "cka.npz") as matrices:
        cka = matrices["round_2"]
        assert cka.shape == (4, 4) and np.allclose(np.diag(cka), 1) and np.allclose(cka, cka.T)
    assert (jobs["dcfl"] / "cka.png").is_file()
