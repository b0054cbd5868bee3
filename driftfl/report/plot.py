"""The accuracy-versus-round plot: mean ± std over each row's runs, under a heading that names
what the rows compare. Up to MAX_CURVES rows share one panel; more are drawn as small multiples
(panels sharing their axes): one panel per value of the leading ``--by`` keys where that leaves
at most MAX_CURVES curves in each, else one panel per row, the other rows faint behind it."""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from pathlib import Path

from .table import Group

MAX_CURVES = 8  # more curves in one panel are told apart by colour no longer


def heading(groups: list[Group], by: list[str]) -> str:
    """What the report compares: the ``--by`` keys, and the settings that split their rows."""
    split = sorted({key for group in groups for key in group.split})
    also = f"; rows also differ in {', '.join(split)}" if split else ""
    return (f"test accuracy by {', '.join(by)}{also}\n"
            f"mean ± std over each row's runs ({len(groups)} rows)")


def panels(groups: list[Group]) -> list[tuple[str, list[Group]]]:
    """(title, rows) per panel: all rows in one; or by the leading ``--by`` values; or one
    panel per row."""
    if len(groups) <= MAX_CURVES:
        return [("", groups)]
    leading: dict[str, list[Group]] = defaultdict(list)
    for group in groups:
        leading[" / ".join(group.name[:-1])].append(group)
    if len(leading) > 1 and max(map(len, leading.values())) <= MAX_CURVES:
        return list(leading.items())
    return [(f"{group.title} (n={len(group.runs)})", [group]) for group in groups]


def curve(group: Group):
    """Rounds, mean and std (in %) of the group's runs, up to the shortest run."""
    import numpy as np

    curves = [run.accuracy for run in group.runs]
    length = min(len(c) for c in curves)
    accuracy = 100 * np.array([c[:length] for c in curves])
    return range(length), accuracy.mean(axis=0), accuracy.std(axis=0)


def plot(groups: list[Group], path: Path, by: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    laid_out = panels(groups)
    columns = min(4, math.ceil(math.sqrt(len(laid_out))))
    rows = math.ceil(len(laid_out) / columns)
    single = len(laid_out) == 1
    fig, axes = plt.subplots(rows, columns, sharex=True, sharey=True, squeeze=False,
                             figsize=(8, 5) if single else (3.6 * columns, 2.6 * rows + 1),
                             layout="constrained")
    # a row's colour is its last --by value's, the same in every panel: ten colours, then
    # the same dashed, then dotted, so that no two look alike
    names = list(dict.fromkeys(group.name[-1] for group in groups))
    style = {name: (f"C{i % 10}", ("-", "--", ":")[i // 10 % 3]) for i, name in enumerate(names)}
    for ax, (title, members) in zip(axes.flat, laid_out):
        if len(members) == 1 and not single:  # the other rows, faint, for scale
            for other in groups:
                if other is not members[0]:
                    ax.plot(*curve(other)[:2], color="0.85", linewidth=0.8)
        for group in members:
            rounds, mean, std = curve(group)
            colour, line = style[group.name[-1]]
            label = group.title if single else group.name[-1]
            ax.plot(rounds, mean, color=colour, linestyle=line,
                    label=f"{label} (n={len(group.runs)})")
            ax.fill_between(rounds, mean - std, mean + std, color=colour, alpha=0.15)
        if title:
            ax.set_title(textwrap.fill(title, 45), fontsize=8)
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    for ax in axes.flat[len(laid_out):]:
        ax.set_visible(False)
    for k, ax in enumerate(axes.flat[:len(laid_out)]):
        if k + columns >= len(laid_out):  # the lowest panel of its column: its rounds named
            ax.set_xlabel("round")
            ax.xaxis.set_tick_params(labelbottom=True)
    for ax in axes[:, 0]:
        ax.set_ylabel("test accuracy (%)")
    if single:  # beside the axes, not on them: an inside legend hides the curves' tails
        axes[0][0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1),
                          borderaxespad=0)
    elif any(len(members) > 1 for _, members in laid_out):  # one legend for every panel
        shown = {group.name[-1]: group for group in groups}
        handles = [plt.Line2D([], [], color=style[name][0], linestyle=style[name][1])
                   for name in shown]
        fig.legend(handles, list(shown), fontsize=8, loc="outside right upper")
    fig.suptitle(heading(groups, by), fontsize=10)
    fig.savefig(path, dpi=120, metadata={"Title": heading(groups, by)})
    plt.close(fig)
