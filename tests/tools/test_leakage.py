"""The leakage measure of shipped images (driftfl.common.leakage) on hand-made cases, and
`driftfl audit` on a hand-built run directory (and, e2e, after a real DCFL run)."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import yaml

from conftest import driftfl_bin
from driftfl.common.leakage import (THRESHOLD, Leakage, channels_last, measure, nearest_real,
                                    plot_pairs, summarise, to_pixels)

pytestmark = pytest.mark.slow  # audits over real condensed sets


def images(n: int, seed: int = 0, shape=(28, 28)) -> np.ndarray:
    """Smooth random uint8 images (blobs, not white noise), like real ones in that pixels
    correlate with their neighbours."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, size=(n, shape[0] // 4, shape[1] // 4, *shape[2:]))
    return np.kron(coarse, np.ones((1, 4, 4, *([1] * len(shape[2:]))))).astype(np.uint8)


def test_copies_score_as_copies_even_brightened_or_with_less_contrast():
    real = images(500)
    shipped = real[[3, 17, 256, 499]].copy()
    shipped[1] = np.clip(np.rint(real[17] * 0.5 + 90), 0, 255).astype(np.uint8)  # contrast
    shipped[2] = np.clip(real[256].astype(int) + 30, 0, 255).astype(np.uint8)  # brightness
    index, correlation = nearest_real(shipped, real)
    assert index.tolist() == [3, 17, 256, 499]
    assert correlation.min() > 0.99
    leakage = measure(shipped, real)
    assert leakage.images == 4 and leakage.copies == 4 and leakage.share == 1.0
    assert leakage.median == pytest.approx(1.0, abs=1e-3) and leakage.max <= 1.0


def test_noise_scores_as_none():
    real = images(500)
    noise = np.random.default_rng(1).integers(0, 256, size=(50, 28, 28), dtype=np.uint8)
    leakage = measure(noise, real)
    assert leakage.copies == 0 and leakage.share == 0.0 and leakage.max < 0.5
    # smooth images unlike any real one are no copies either
    assert measure(images(50, seed=2), real).share == 0.0


def test_a_constant_image_correlates_with_nothing():
    real = np.concatenate([images(20), np.full((1, 28, 28), 128, np.uint8)])
    shipped = np.stack([np.full((28, 28), 128, np.uint8), np.zeros((28, 28), np.uint8)])
    _, correlation = nearest_real(shipped, real)
    assert correlation.tolist() == [0.0, 0.0]
    _, correlation = nearest_real(real[:3], np.zeros((5, 28, 28), np.uint8))
    assert correlation.tolist() == [0.0, 0.0, 0.0]


def test_chunks_give_the_answer_of_one_block():
    real = images(300, shape=(8, 8, 3))
    shipped = np.concatenate([real[[5, 150, 299]], images(10, seed=3, shape=(8, 8, 3))])
    whole = nearest_real(shipped, real, chunk=4096)
    for chunk in (1, 7, 64, 299):
        index, correlation = nearest_real(shipped, real, chunk=chunk)
        assert index.tolist() == whole[0].tolist()
        np.testing.assert_allclose(correlation, whole[1], atol=1e-5)  # float32 sums


def test_shapes_that_do_not_match_and_no_real_images_are_refused():
    with pytest.raises(ValueError, match="cannot be compared"):
        nearest_real(images(2), images(2, shape=(32, 32)))
    with pytest.raises(ValueError, match="no real images"):
        nearest_real(images(2), np.zeros((0, 28, 28), np.uint8))


@pytest.mark.parametrize("channels", [1, 3])
def test_to_pixels_takes_normalised_images_back_to_their_uint8_pixels(channels):
    from driftfl.common.datasets import channel_stats, to_tensors

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(6, channels, 5, 7), dtype=np.uint8)
    mean, std = channel_stats(x)
    normalised = to_tensors(x, np.zeros(6), mean, std)[0].numpy()
    pixels = to_pixels(normalised, mean, std)
    assert pixels.dtype == np.uint8
    assert pixels.shape == ((6, 5, 7) if channels == 1 else (6, 5, 7, 3))
    assert np.array_equal(pixels, channels_last(x))
    # values a condensation pushed beyond the pixel range are clipped
    far = to_pixels(np.full((1, channels, 2, 2), 1e3, np.float32), mean, std)
    assert (far == 255).all()


def test_the_line_and_the_record_say_what_was_measured():
    leakage = summarise(np.array([0.99, 0.2, 0.5, 0.97]))
    assert leakage == Leakage(4, 2, 0.5, pytest.approx(0.735), 0.99)
    assert leakage.line() == ("2 of 4 shipped images (50.0 %) have a real image of this client "
                              "with Pearson correlation >= 0.95; median nearest 0.73, max 0.99")
    assert leakage.as_dict() == {"images": 4, "copies": 2, "share": 0.5, "median": 0.735,
                                 "max": 0.99, "threshold": THRESHOLD, "similarity": "pearson"}
    empty = measure(np.zeros((0, 28, 28), np.uint8), images(3))
    assert empty.images == 0 and empty.share == 0.0 and empty.as_dict()["median"] is None


@pytest.mark.parametrize("shape", [(28, 28), (8, 8, 3)])
def test_plot_pairs_writes_a_png(tmp_path, shape):
    real = images(40, shape=shape)
    shipped, labels = real[:23], np.arange(23) % 3
    index, correlation = nearest_real(shipped, real)
    path = tmp_path / "pairs.png"
    plot_pairs(shipped, labels, real, index, correlation, path, "client 0")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_run_directory_keeps_each_shipped_set_in_pixel_scale(tmp_path):
    from driftfl.common.config import compose
    from driftfl.common.datasets import channel_stats, to_tensors
    from driftfl.server.results import RunRecorder

    x = images(6)[:, None]  # (N, 1, H, W) as datasets hold them
    y = np.array([0, 0, 1, 1, 2, 2])
    mean, std = channel_stats(x)
    recorder = RunRecorder(tmp_path / "run", compose(["rounds=1"]), run_id=1)
    recorder.add_images({"client_3": (to_tensors(x, y, mean, std)[0].numpy(), y)}, mean, std)
    folder = tmp_path / "run" / "images"
    with np.load(folder / "client_3.npz") as shipped:
        assert np.array_equal(shipped["x"], x[:, 0]) and shipped["y"].dtype == np.int64
        assert shipped["y"].tolist() == y.tolist()
    assert (folder / "client_3.png").is_file()
    # a client with no class to condense ships an empty set: nothing to keep, nothing to plot
    recorder.add_images({"client_4": (np.zeros((0, 1, *x.shape[2:]), np.float32),
                                      np.zeros(0, np.int64))}, mean, std)
    assert not any(folder.glob("client_4*"))


# -- driftfl audit on a hand-built run directory ------------------------------------------
OVERRIDES = ["strategy=dcfl", "model=mlp", "dataset.subset=2000", "num_clients=3",
             "partition=iid"]


@pytest.fixture
def run_dir(tmp_path, fmnist_available):
    """What a DCFL run leaves for the audit: config.yaml, partition.json and each client's
    shipped set; client 0 shipped copies of its own images, client 1 noise, client 2 a mix."""
    from driftfl.common.config import compose
    from driftfl.common.partition import partition
    from driftfl.server.experiment import prepare_experiment

    experiment = prepare_experiment(compose(OVERRIDES))
    cfg, data = experiment.cfg, experiment.data
    parts = partition(data.train_y, cfg.partition, cfg.num_clients, cfg.seed,
                      experiment.aux_indices)
    folder = tmp_path / "run"
    (folder / "images").mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    (folder / "partition.json").write_text(json.dumps({"clients": [
        {"partition_id": k, "node_id": 100 + k, "num_examples": len(p)}
        for k, p in enumerate(parts)]}))
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, size=(10, 28, 28), dtype=np.uint8)
    own = [channels_last(data.train_x[p[:10]]) for p in parts]
    for k, x in enumerate([own[0], noise, np.concatenate([own[2][:5], noise[:5]])]):
        np.savez_compressed(folder / "images" / f"client_{k}.npz", x=x,
                            y=np.arange(10, dtype=np.int64) % 2)
    return folder


def test_audit_measures_every_client_and_writes_its_record_and_pictures(run_dir, capsys):
    from driftfl.audit import main

    main([str(run_dir)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("  client 0: 10 of 10 shipped images (100.0 %)")
    assert lines[2].startswith("  client 1: 0 of 10 shipped images (0.0 %)")
    assert lines[3].startswith("  client 2: 5 of 10 shipped images (50.0 %)")
    assert lines[4].startswith("  all clients: 15 of 30 shipped images (50.0 %)")
    report = json.loads((run_dir / "audit.json").read_text())
    assert report["clients"]["0"]["share"] == 1.0 and report["clients"]["0"]["median"] > 0.999
    assert report["clients"]["1"]["copies"] == 0
    assert report["overall"] == {**report["overall"], "images": 30, "copies": 15,
                                 "similarity": "pearson", "threshold": THRESHOLD}
    for k in range(3):
        assert (run_dir / "images" / f"pairs_client_{k}.png").is_file()

    main([str(run_dir), "--threshold", "0"])  # a looser threshold counts more as copies
    assert json.loads((run_dir / "audit.json").read_text())["clients"]["1"]["threshold"] == 0


def test_after_a_run_the_audit_goes_into_the_summary_and_a_failure_is_only_a_warning(
        run_dir, capsys):
    from driftfl.audit import audit_after_run

    (run_dir / "summary.json").write_text(json.dumps({"status": "completed"}))
    audit_after_run(run_dir, None)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["condensed_leakage"] == json.loads((run_dir / "audit.json").read_text())
    assert summary["condensed_leakage"]["overall"]["copies"] == 15

    (run_dir / "summary.json").write_text(json.dumps({"status": "completed"}))
    (run_dir / "images" / "client_1.npz").write_bytes(b"not an npz")
    capsys.readouterr()
    audit_after_run(run_dir, None)
    assert json.loads((run_dir / "summary.json").read_text()) == {"status": "completed"}
    err = capsys.readouterr().err
    assert err.startswith("driftfl: warning: the audit of the shipped images failed: "
                          f"{run_dir / 'images' / 'client_1.npz'} is not an .npz archive"), err

    for path in (run_dir / "images").glob("client_*.npz"):  # a run that shipped nothing
        path.unlink()
    audit_after_run(run_dir, None)
    assert capsys.readouterr() == ("", "")
    assert json.loads((run_dir / "summary.json").read_text()) == {"status": "completed"}


def test_audit_reads_a_deployed_runs_data_from_the_files_split_wrote(run_dir, tmp_path, capsys):
    from driftfl.audit import main

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**config, "superlink": "fleet"}))
    with pytest.raises(SystemExit) as stopped:
        main([str(run_dir)])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        f"driftfl: error: {run_dir} is a deployed run: its clients' data stayed on their nodes; "
        "pass --data DIR with the client-<k>.npz files `driftfl split` wrote\n")

    shares = tmp_path / "shares"
    shares.mkdir()
    with pytest.raises(SystemExit):
        main([str(run_dir), "--data", str(shares)])
    assert capsys.readouterr() == ("", f"driftfl: error: {shares / 'client-0.npz'} is missing: "
                                       "--data names the folder `driftfl split` wrote, with "
                                       "client-<k>.npz for each client\n")
    for k in range(3):  # each owner's data: here, what it shipped, so every image is a copy
        with np.load(run_dir / "images" / f"client_{k}.npz") as shipped:
            np.savez(shares / f"client-{k}.npz", x=shipped["x"][:, None], y=shipped["y"])
    main([str(run_dir), "--data", str(shares)])
    report = json.loads((run_dir / "audit.json").read_text())
    assert report["overall"]["share"] == 1.0


def test_audit_refuses_a_truncated_or_inflating_data_file_in_one_line(run_dir, tmp_path, capsys,
                                                                    monkeypatch):
    """--data's files are bounded as the run directory's: what their members declare is read
    before any is inflated (issue 52: a 390 KB file took 500 MB, a truncated one a traceback)."""
    import driftfl.audit
    from driftfl.audit import main

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**config, "superlink": "fleet"}))
    shares = tmp_path / "shares"
    shares.mkdir()
    for k in range(3):
        with np.load(run_dir / "images" / f"client_{k}.npz") as shipped:
            np.savez(shares / f"client-{k}.npz", x=shipped["x"][:, None], y=shipped["y"])
    whole = (shares / "client-1.npz").read_bytes()
    (shares / "client-1.npz").write_bytes(whole[:len(whole) // 2])
    with pytest.raises(SystemExit) as stopped:
        main([str(run_dir), "--data", str(shares)])
    assert stopped.value.code == 2
    out, err = capsys.readouterr()
    assert err == (f"driftfl: error: {shares / 'client-1.npz'} is not an .npz archive of arrays "
                   "(BadZipFile); pass --data DIR with the client-<k>.npz files `driftfl split` "
                   "wrote\n") and out == ""

    monkeypatch.setattr(driftfl.audit, "MAX_CLIENT_DATA_BYTES", 2**20)  # (2 GiB in use)
    np.savez_compressed(shares / "client-1.npz", x=np.zeros((4096, 1, 28, 28), np.float32),
                        y=np.zeros(4096, np.int64))  # 12 MiB of zeros in a few KB
    assert (shares / "client-1.npz").stat().st_size < 2**16
    with pytest.raises(SystemExit) as stopped:
        main([str(run_dir), "--data", str(shares)])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        f"driftfl: error: {shares / 'client-1.npz'} declares 12 MiB of arrays, more than the "
        "1 MiB it can hold here; pass --data DIR with the client-<k>.npz files `driftfl split` "
        "wrote\n")


def test_audit_refuses_what_it_cannot_measure_in_one_line(run_dir, tmp_path):
    def audit(*args):
        out = subprocess.run([driftfl_bin(), "audit", *map(str, args)], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
        assert len(out.stderr.splitlines()) == 1, out.stderr
        return out.stderr

    assert "is not a run directory (no config.yaml)" in audit(tmp_path / "nowhere")
    plain = tmp_path / "fedavg"
    plain.mkdir()
    (plain / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    assert "holds no shipped images (images/client_<id>.npz)" in audit(plain)
    assert "--threshold must be a correlation in [-1, 1]" in audit(run_dir, "--threshold", 2)
    assert "required: run_dir (usage: driftfl audit RUN_DIR" in audit()

    # partition.json that does not match the data rebuilt here: not the data it trained on
    record = json.loads((run_dir / "partition.json").read_text())
    record["clients"][1]["num_examples"] += 1
    (run_dir / "partition.json").write_text(json.dumps(record))
    assert "client 1's partition rebuilt here holds" in audit(run_dir)


@pytest.mark.e2e
def test_driftfl_run_audits_what_dcfl_shipped_into_the_summary(tmp_path, fmnist_available,
                                                                simulation_host):
    """A tiny real DCFL run: its shipped sets are kept as arrays, audited after the run, and
    the result is in summary.json (at the default start from real images, mostly copies)."""
    run_dir = tmp_path / "run"
    out = subprocess.run([driftfl_bin(), "run", "strategy=dcfl", "num_clients=2", "rounds=1",
                          "model=mlp", "dataset.subset=2000", "dataset.test_subset=500",
                          "strategy.condense_iterations=2", "strategy.pretrain_requests=0",
                          f"hydra.run.dir={run_dir}"],
                         cwd=tmp_path, env=simulation_host, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "  client 0: " in out.stdout and "  all clients: " in out.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    leakage = summary["condensed_leakage"]
    assert sorted(leakage["clients"]) == ["0", "1"]
    assert leakage == json.loads((run_dir / "audit.json").read_text())
    assert all(0 <= c["share"] <= 1 and c["similarity"] == "pearson"
               for c in leakage["clients"].values())
    for k in range(2):
        with np.load(run_dir / "images" / f"client_{k}.npz") as shipped:
            assert shipped["x"].dtype == np.uint8 and shipped["x"].shape[1:] == (28, 28)
            assert shipped["y"].dtype == np.int64 and len(shipped["y"]) == len(shipped["x"])
        assert (run_dir / "images" / f"pairs_client_{k}.png").is_file()
