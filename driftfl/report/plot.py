"""The accuracy-versus-round plot: mean ± std over each row's runs."""

from __future__ import annotations

from pathlib import Path

from .table import Group


def plot(groups: list[Group], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, group in enumerate(groups):
        curves = [run.accuracy for run in group.runs]
        length = min(len(c) for c in curves)
        acc = 100 * np.array([c[:length] for c in curves])
        mean, std = acc.mean(axis=0), acc.std(axis=0)
        # ten colours, then the same colours dashed, so that no two groups look alike
        ax.plot(range(length), mean, label=f"{group.title} (n={len(curves)})",
                linestyle=("-", "--", ":")[i // 10 % 3])
        ax.fill_between(range(length), mean - std, mean + std, alpha=0.15)
    ax.set(xlabel="round", ylabel="test accuracy (%)", title="mean ± std over runs")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    # beside the axes, not on them: with a dozen groups an inside legend hides the curves' tails
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
