"""Per-client evaluation in the report: the spread columns of each run's last evaluated round
(client_acc_before_mean, ..., client_acc_after_best) as mean ± std over the runs, and a plot
of the spread across clients per round (mean, worst 10 % and best client, before and after
local training)."""

from __future__ import annotations

from pathlib import Path

from .runs import Run, number
from .groups import Group, mean_std

STATS = ("mean", "std", "worst10", "best")
COLUMNS = tuple(f"client_acc_{phase}_{stat}" for phase in ("before", "after") for stat in STATS)


def last_evaluated(run: Run) -> dict | None:
    """The run's last round with per-client figures (None: it measured none)."""
    return next((row for row in reversed(run.trained)
                 if number(row.get("client_acc_after_mean"))), None)


def recorded(groups: list[Group]) -> bool:
    return any(last_evaluated(run) for group in groups for run in group.runs)


def header() -> list[str]:
    return [f"client acc {c.split('_')[2]} {c.split('_')[3]} (%)" for c in COLUMNS]


def cells(group: Group) -> list[str]:
    """Each column's mean ± std over the runs that measured it (in %), '-' where none did."""
    rows = [row for row in map(last_evaluated, group.runs) if row]
    return [mean_std([row[c] for row in rows]) if rows else "-" for c in COLUMNS]


def plot_spread(groups: list[Group], path: Path) -> None:
    """Per round, each group's mean client accuracy (mean over runs) with the worst 10 % of
    clients dashed and the band up to the best client: before local training (the global model
    on each client's split: who it leaves behind) beside after (each client's trained model)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    shown = [g for g in groups if recorded([g])]
    # past the default cycle's 10 colours, 20 paired ones, so that no two groups share one
    colours = plt.get_cmap("tab10" if len(shown) <= 10 else "tab20").colors
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    for phase, ax in zip(("before", "after"), axes):
        ax.set_prop_cycle(color=colours)
        for group in shown:
            by_round: dict[int, list[dict]] = {}
            for run in group.runs:
                for row in run.trained:
                    if number(row.get(f"client_acc_{phase}_mean")):
                        by_round.setdefault(row["round"], []).append(row)
            rounds = sorted(by_round)
            mean, worst, best = (100 * np.array([np.mean([r[f"client_acc_{phase}_{s}"]
                                                           for r in by_round[k]])
                                                  for k in rounds])
                                 for s in ("mean", "worst10", "best"))
            line, = ax.plot(rounds, mean, marker=".", label=f"{group.title}: mean client")
            ax.plot(rounds, worst, linestyle="--", color=line.get_color(),
                    label=f"{group.title}: worst 10 %")
            ax.fill_between(rounds, worst, best, color=line.get_color(), alpha=0.12)
        ax.set(xlabel="round", title=f"{phase} local training")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("client accuracy on its held-out split (%)")
    fig.suptitle("spread across clients (band: worst 10 % to best), mean over runs")
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
