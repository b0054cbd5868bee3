"""The run directory's pictures: accuracy and loss, per-class accuracy, the clients' label split,
the clients' rounds and accuracies, per-round matrices and image sets. Matplotlib draws on its
Agg backend: a server has no display."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

MAX_LINES = 20  # classes drawn as curves (tab20's colours); more are drawn as a heatmap
MAX_CLIENT_ROWS = 100  # clients drawn in partition.png; the rest are in partition.json


def pyplot():
    """matplotlib.pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def class_names(classes: list[str] | None, count: int) -> list[str]:
    """The dataset's class names where they are known (one distinct name per class), else the
    indices."""
    named = list(map(str, classes or []))
    return named if len(set(named)) == len(named) == count else [str(i) for i in range(count)]


def plot_partition(clients: list[dict], classes: list[str] | None, path: Path,
                   title: str) -> tuple[np.ndarray, list[str]]:
    """partition.png: each client's label counts (partition.json's) as stacked bars, a colour
    per class named in the legend, or a clients x classes heatmap where there are more than
    MAX_LINES classes. Drawn with matplotlib alone: flwr-datasets' ``plot_label_distributions``
    drew it before, but importing it (Hugging Face datasets, seaborn, SciPy) cost every run
    about 2.3 s of CPU for one picture. Returns what the picture shows, read back from it: the
    counts (clients x classes) and the classes' names."""
    plt = pyplot()
    shown = clients[:MAX_CLIENT_ROWS]
    counts = np.asarray([c["label_histogram"] for c in shown], dtype=np.int64)
    names = class_names(classes, counts.shape[1])
    many = len(names) > MAX_LINES
    if len(clients) > len(shown):
        title += f"\n(the first {len(shown)} of {len(clients)} clients; all in partition.json)"
    row_height = 0.12 if many else 0.25  # a heatmap's rows can be thinner than bars
    fig, ax = plt.subplots(figsize=(max(7.0, 0.12 * len(names) + 4) if many else 8,
                                    max(3.5, row_height * len(shown) + 1.5)),
                           layout="constrained")
    rows = np.arange(len(shown))
    if many:
        image = ax.imshow(counts, aspect="auto", interpolation="nearest", cmap="viridis")
        fig.colorbar(image, ax=ax, label="training samples")
        step = max(1, len(names) // 40)
        ax.set_xticks(np.arange(0, len(names), step), names[::step], rotation=90, fontsize=7)
        drawn, named = np.asarray(image.get_array()), names
    else:
        colours = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
        left = np.zeros(len(shown), dtype=np.int64)
        for k, name in enumerate(names):
            ax.barh(rows, counts[:, k], left=left, height=0.8, color=colours(k), label=name)
            left += counts[:, k]
        ax.invert_yaxis()  # client 0 on top, as in the console's table and the heatmap
        handles, named = ax.get_legend_handles_labels()
        fig.legend(handles, named, title="class", fontsize=8, loc="outside right upper")
        drawn = np.array([[bar.get_width() for bar in bars] for bars in ax.containers]).T
    who = [str(c["partition_id"]) if c["partition_id"] >= 0 else f"own data (node {c['node_id']})"
           for c in shown]
    step = max(1, len(who) // 40)  # every step-th client named where there are too many
    ax.set_yticks(rows[::step], who[::step], fontsize=7 if len(who) > 30 else 9)
    ax.set(title=title, ylabel="client (partition)",
           xlabel="class" if many else "training samples")
    fig.savefig(path, dpi=110, metadata={"Title": title})
    plt.close(fig)
    return drawn.reshape(counts.shape).astype(np.int64), list(named)


def plot_per_class(rows: list[dict], classes: list[str] | None, path: Path, title: str) -> bool:
    """per_class.png: the global model's test accuracy on each class over the rounds (metrics.csv's
    acc_class_* columns): a curve per class, or a class x round heatmap where there are more than
    MAX_LINES classes. False (nothing drawn) where no round measured it."""
    measured = [r for r in rows if r.get("per_class_accuracy")]
    if not measured:
        return False
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    rounds = [r["round"] for r in measured]
    accuracy = 100 * np.array([r["per_class_accuracy"] for r in measured], dtype=float)
    names = class_names(classes, accuracy.shape[1])
    if len(names) <= MAX_LINES:
        fig, ax = plt.subplots(figsize=(9, 4.5), layout="constrained")
        colours = plt.get_cmap("tab10" if len(names) <= 10 else "tab20").colors
        for i, name in enumerate(names):
            ax.plot(rounds, accuracy[:, i], marker="o", markersize=3, color=colours[i],
                    label=f"{i} {name}" if name != str(i) else name)
        ax.set(xlabel="round", ylabel="test accuracy on the class (%)", ylim=(-2, 102))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(title="class", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1),
                  borderaxespad=0)
    else:
        fig, ax = plt.subplots(figsize=(max(6.0, 0.25 * len(rounds) + 3),
                                        max(4.0, 0.12 * len(names) + 1.5)), layout="constrained")
        image = ax.imshow(accuracy.T, aspect="auto", vmin=0, vmax=100, cmap="viridis",
                          interpolation="nearest",
                          extent=(rounds[0] - 0.5, rounds[-1] + 0.5, len(names) - 0.5, -0.5))
        ax.set(xlabel="round", ylabel="class")
        if len(names) <= 60:
            ax.set_yticks(range(len(names)), names, fontsize=6)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.colorbar(image, ax=ax, fraction=0.05, label="test accuracy on the class (%)")
    ax.set_title(f"{title}\nglobal model's test accuracy per class", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


AXES = {"credibility": ("predicted class", "true class"), "cka": ("client", "client")}


def plot_image_grid(pixels: np.ndarray, y: np.ndarray, path: Path, title: str) -> None:
    """Images in pixel scale (uint8 (N, H, W) or (N, H, W, C), as leakage.to_pixels gives
    them) tiled one row per label."""
    plt = pyplot()
    pixels = (pixels[..., None] if pixels.ndim == 3 else pixels) / 255.0  # N, H, W, C
    labels = sorted(set(y.tolist()))
    rows = [np.flatnonzero(y == label) for label in labels]
    n, h, w, c = pixels.shape
    width = max(len(r) for r in rows)
    canvas = np.ones(((h + 2) * len(rows), (w + 2) * width, c))  # white 2-pixel gaps
    for r, members in enumerate(rows):
        for col, i in enumerate(members):
            canvas[r * (h + 2):r * (h + 2) + h, col * (w + 2):col * (w + 2) + w] = pixels[i]
    fig, ax = plt.subplots(figsize=(max(3.0, width * 0.6), len(rows) * 0.6 + 0.6))
    ax.imshow(canvas[..., 0] if c == 1 else canvas, cmap="gray", vmin=0, vmax=1)
    ax.set_yticks([r * (h + 2) + h / 2 for r in range(len(rows))],
                  [f"class {label}" for label in labels], fontsize=7)
    ax.set_xticks([])
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_heatmaps(by_round: dict[str, np.ndarray], path: Path, name: str) -> None:
    """The first and the last round's matrix side by side (all rounds are in <name>.npz)."""
    plt = pyplot()
    keys = sorted(by_round, key=lambda k: int(k.split("_")[1]))
    shown = [keys[0], keys[-1]] if len(keys) > 1 else keys
    fig, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 4.4), squeeze=False)
    for ax, key in zip(axes[0], shown):
        image = ax.imshow(by_round[key], vmin=0, vmax=1, cmap="viridis")
        x_label, y_label = AXES.get(name, ("", ""))
        ax.set(title=f"{name}, round {key.split('_')[1]}", xlabel=x_label, ylabel=y_label)
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


OUTCOME_COLOURS = {"accepted": "tab:green", "rejected": "tab:red", "dropped": "tab:gray",
                   "lost": "black", "late": "tab:orange"}


def clients_tell_something(rows: list[dict]) -> bool:
    """Whether clients.png would show anything: a measured per-client accuracy, an outcome
    other than accepted, or clients in differing numbers of rounds (sampling). Where every
    client was accepted in every round it would draw only equal bars."""
    if any(r.get("acc_after") not in (None, "") for r in rows):
        return True
    if any(r.get("outcome", "accepted") != "accepted" for r in rows):
        return True
    return len(set(Counter(r["client"] for r in rows).values())) > 1


def percent_axis(axes, values: list[float]) -> None:
    """An x axis of accuracies in % that spans at least 10 points around ``values`` and never
    passes 0 or 100 (a point of room at either end, so a marker there shows whole)."""
    low, high = max(0.0, min(values) - 2), min(100.0, max(values) + 2)
    if high - low < 10:  # widen about the values, then against whichever end it met
        low = max(0.0, low - (10 - (high - low)) / 2)
        high = min(100.0, max(high, low + 10))
        low = min(low, high - 10)
    axes.set_xlim(low - 1, high + 1)
    axes.set_xticks([t for t in axes.get_xticks() if low <= t <= high])  # not past 0 or 100
    axes.set_xlim(low - 1, high + 1)


def plot_clients(rows: list[dict], path: Path, title: str) -> None:
    """clients.csv in a picture: per client the rounds it was in, by outcome, and where
    per-client evaluation ran, its last measured accuracy before and after local training."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    names = list(dict.fromkeys(r["client"] for r in sorted(
        rows, key=lambda r: (not str(r["client"]).isdigit(),
                             int(r["client"]) if str(r["client"]).isdigit() else 0))))
    place = {name: i for i, name in enumerate(names)}
    last: dict[str, dict] = {}  # the last measured accuracies per client
    for r in rows:
        if r.get("acc_after") not in (None, ""):
            last[r["client"]] = r
    fig, axes = plt.subplots(1, 2 if last else 1, figsize=(11 if last else 6,
                             max(3.0, 0.22 * len(names) + 1.2)), squeeze=False,
                             layout="constrained")
    bars, left = axes[0][0], np.zeros(len(names))
    for outcome, colour in OUTCOME_COLOURS.items():
        counts = np.zeros(len(names))
        for r in rows:
            if r.get("outcome", "accepted") == outcome:
                counts[place[r["client"]]] += 1
        if counts.any():
            bars.barh(range(len(names)), counts, left=left, color=colour, label=outcome)
            left += counts
    bars.set(xlabel="rounds", ylabel="client", title="rounds per client, by outcome")
    bars.set_yticks(range(len(names)), names, fontsize=7 if len(names) > 20 else 9)
    bars.invert_yaxis()
    bars.xaxis.set_major_locator(MaxNLocator(integer=True))
    # below the figure, in room the layout makes: under the axes it covered their label
    fig.legend(*bars.get_legend_handles_labels(), fontsize=8, ncol=len(OUTCOME_COLOURS),
               loc="outside lower center")
    if last:
        accuracy, shown, values = axes[0][1], [n for n in names if n in last], []
        # after: an open square around before's dot, so that equal values both show
        for phase, style in (("before", {"marker": "o", "s": 18}),
                             ("after", {"marker": "s", "s": 70, "facecolors": "none",
                                        "edgecolors": "C1"})):
            values += [100 * float(last[n][f"acc_{phase}"]) for n in shown]
            accuracy.scatter(values[-len(shown):], [place[n] for n in shown], **style,
                             label=f"{phase} local training")
        percent_axis(accuracy, values)
        accuracy.set(xlabel="accuracy on its held-out split (%)",
                     title="last measured round", ylim=bars.get_ylim())
        accuracy.set_yticks([])
        accuracy.legend(fontsize=8)
        accuracy.grid(alpha=0.3)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_accuracy(rows: list[dict], path: Path, title: str) -> None:
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()

    rounds = [r["round"] for r in rows]
    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(10, 4))
    acc_ax.plot(rounds, [100 * r["test_accuracy"] for r in rows], marker="o")
    acc_ax.set(xlabel="round", ylabel="test accuracy (%)", title="global model accuracy")
    loss_ax.plot(rounds, [r["test_loss"] for r in rows], marker="o", color="tab:red")
    loss_ax.set(xlabel="round", ylabel="test loss", title="global model loss")
    for ax in (acc_ax, loss_ax):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Title": title})  # a script can read what it shows
    plt.close(fig)
