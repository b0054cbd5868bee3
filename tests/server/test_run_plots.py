"""The run directory's pictures of non-IID work: partition.png (the clients' label counts, read
back from the picture's bars) and per_class.png (the global model's accuracy on each class)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from driftfl.common.config import compose
from driftfl.common.partition import compute_partition, label_histogram
from driftfl.server.plots import MAX_LINES, plot_partition, plot_per_class
from driftfl.server.results import RunRecorder

CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def dirichlet_clients(num_clients: int = 6, seed: int = 0) -> list[dict]:
    """The clients as the simulated survey reports them, for a real Dirichlet(0.3) split."""
    labels = np.random.default_rng(seed).integers(0, len(CLASSES), 1200)
    shares = compute_partition(labels, {"name": "dirichlet", "alpha": 0.3, "min_size": 5},
                               num_clients, seed)
    return [{"node_id": 100 + i, "partition_id": i, "num_examples": len(share),
             "label_histogram": label_histogram(labels[share], len(CLASSES))}
            for i, share in enumerate(shares)]


def a_png(path) -> tuple[int, int]:
    """The picture's size; fails unless ``path`` is a whole PNG of some substance."""
    assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000
    with Image.open(path) as png:
        png.verify()
    with Image.open(path) as png:
        return png.size


def test_partition_png_draws_exactly_the_partitions_label_counts(tmp_path):
    clients = dirichlet_clients()
    counts, named = plot_partition(clients, CLASSES, tmp_path / "partition.png",
                                   "a Dirichlet split")
    # the bars' lengths, read back from the figure: the partition's own counts
    assert counts.tolist() == [c["label_histogram"] for c in clients]
    assert named == CLASSES  # the legend names the classes, in class order
    width, height = a_png(tmp_path / "partition.png")
    assert width > 600 and height > 300


def test_partition_png_keeps_a_client_without_samples_and_draws_many_classes_as_a_heatmap(
        tmp_path):
    clients = dirichlet_clients()
    clients[2]["label_histogram"] = [0] * len(CLASSES)  # a client the split left empty
    counts, _ = plot_partition(clients, CLASSES, tmp_path / "empty.png", "t")
    assert counts[2].sum() == 0 and counts.tolist() == [c["label_histogram"] for c in clients]
    many = [{"node_id": i, "partition_id": i, "label_histogram": [i + k % 3 for k in range(40)]}
            for i in range(5)]
    counts, named = plot_partition(many, None, tmp_path / "many.png", "forty classes")
    assert counts.tolist() == [c["label_histogram"] for c in many]  # the heatmap's cells
    assert named[:2] == ["0", "1"] and len(named) == 40
    a_png(tmp_path / "many.png")


def test_the_recorder_writes_partition_png_and_says_whose_counts_it_shows(tmp_path):
    summary = {"dataset": "fmnist", "classes": CLASSES, "clients": dirichlet_clients()}
    simulated = RunRecorder(tmp_path / "sim", compose(["partition=dirichlet"]))
    simulated.partition(summary)
    deployed = RunRecorder(tmp_path / "dep", compose(["superlink=lab"]))
    deployed.partition(summary)
    simulated.drawn()  # drawn beside the first round: wait for it
    deployed.drawn()
    titles = {}
    for name in ("sim", "dep"):
        a_png(tmp_path / name / "partition.png")
        with Image.open(tmp_path / name / "partition.png") as png:
            titles[name] = png.text["Title"]
    assert titles["sim"] == "clients' training labels on fmnist (Dirichlet(0.5) split)"
    assert titles["dep"] == "clients' training labels on fmnist (as the nodes reported them)"


def test_no_partition_png_without_label_counts(tmp_path):
    recorder = RunRecorder(tmp_path, compose([]))
    recorder.partition({"dataset": "fmnist", "classes": CLASSES, "clients": [
        {"node_id": 1, "partition_id": 0, "num_examples": 10}]})
    assert (tmp_path / "partition.json").is_file()
    assert not (tmp_path / "partition.png").exists()


def rows(num_classes: int, rounds: int = 4) -> list[dict]:
    rng = np.random.default_rng(1)
    return [{"round": r, "test_accuracy": 0.5, "test_loss": 1.0,
             "per_class_accuracy": rng.random(num_classes).tolist()} for r in range(rounds)]


def test_per_class_png_from_the_rounds_rows(tmp_path):
    assert plot_per_class(rows(10), CLASSES, tmp_path / "ten.png", "fedavg on fmnist")
    assert plot_per_class(rows(MAX_LINES + 5), None, tmp_path / "many.png", "t")  # a heatmap
    for name in ("ten.png", "many.png"):
        a_png(tmp_path / name)
    measured_none = [{"round": 0, "test_accuracy": 0.1, "test_loss": 2.0}]
    assert not plot_per_class(measured_none, CLASSES, tmp_path / "none.png", "t")
    assert not (tmp_path / "none.png").exists()


def test_a_finished_run_has_per_class_png_with_its_datasets_class_names(tmp_path):
    recorder = RunRecorder(tmp_path, compose(["rounds=3"]))
    recorder.partition({"dataset": "fmnist", "classes": CLASSES, "clients": dirichlet_clients()})
    for row in rows(10):
        recorder.add_round({**row, "seconds": 1.0, "clients": 6})
    recorder.finish(torch.nn.Linear(2, 2), {"status": "completed"}, "fedavg on fmnist")
    assert recorder.classes == CLASSES
    a_png(tmp_path / "per_class.png")
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert [c for c in header if c.startswith("acc_class_")] == [
        f"acc_class_{i}" for i in range(10)]


def finished_with_clients(run_dir, clients_rows: list[dict]):
    recorder = RunRecorder(run_dir, compose(["rounds=2"]))
    for r in (0, 1, 2):
        recorder.add_round({"round": r, "test_accuracy": 0.5, "test_loss": 1.0})
    recorder.add_clients(1, clients_rows)
    recorder.finish(torch.nn.Linear(2, 2), {"status": "completed"}, "t")
    return run_dir / "clients.png"


def test_clients_png_only_where_it_tells_the_clients_apart(tmp_path):
    every_round = [{"round": r, "client": str(c), "examples": 10, "outcome": "accepted"}
                   for r in (1, 2) for c in range(3)]
    # a default run: every client accepted in every round, equal bars and nothing else
    png = finished_with_clients(tmp_path / "plain", every_round)
    assert not png.exists() and (tmp_path / "plain" / "clients.csv").is_file()
    late = [*every_round[:-1], {**every_round[-1], "outcome": "late"}]
    sampled = every_round[:-1]  # client 2 sat round 2 out
    measured = [{**every_round[0], "acc_before": 0.4, "acc_after": 0.6}, *every_round[1:]]
    for name, rows in (("late", late), ("sampled", sampled), ("measured", measured)):
        a_png(finished_with_clients(tmp_path / name, rows))


@pytest.mark.parametrize("values, within", [
    ([100.0, 100.0, 100.0], (89.0, 101.0)),  # every client at 100 %: not 96 to 104 %
    ([0.0, 3.0], (-1.0, 11.0)),
    ([40.0, 90.0], (37.0, 93.0)),
])
def test_the_clients_accuracy_axis_stays_within_0_and_100_and_spans_10_points(values, within):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from driftfl.server.plots import percent_axis

    fig, axes = plt.subplots()
    percent_axis(axes, values)
    assert axes.get_xlim() == within
    assert all(0 <= t <= 100 for t in axes.get_xticks())
    plt.close(fig)
