"""`driftfl report`'s picture with many rows: small multiples sharing their axes, and a heading
that names what the rows compare."""

from __future__ import annotations

from PIL import Image
from test_report import write_run

from driftfl.report import main as report
from driftfl.report.plot import MAX_CURVES, heading, panels
from driftfl.report.runs import find_runs
from driftfl.report.table import group_runs

LABELS = [f"method{i:02d}" for i in range(12)]


def title_of(png) -> str:
    with Image.open(png) as image:
        assert image.size[0] > 800 and image.size[1] > 500
        return image.text["Title"]


def test_many_rows_get_a_panel_each_under_a_heading_naming_the_by_key(tmp_path, capsys):
    for i, label in enumerate(LABELS):
        for seed in range(2):
            write_run(tmp_path / f"{label}-{seed}", label, [0.1, 0.3 + i / 50, 0.5 + i / 50],
                      seed=seed)
    report([str(tmp_path)])
    groups = group_runs(find_runs([tmp_path])[0], ["label"])
    laid_out = panels(groups)
    assert len(groups) == 12 > MAX_CURVES
    assert [title for title, _ in laid_out] == [f"{label} (n=2)" for label in LABELS]
    assert title_of(tmp_path / "report.png") == (
        "test accuracy by label\nmean ± std over each row's runs (12 rows)")
    assert "report.png" in capsys.readouterr().out


def test_rows_of_several_by_keys_share_a_panel_per_leading_value(tmp_path):
    for partition in ("dirichlet", "iid", "pathological"):
        for label in LABELS[:4]:
            write_run(tmp_path / f"{partition}-{label}", label, [0.1, 0.5, 0.7],
                      partition={"name": partition})
    report([str(tmp_path), "--by", "partition.name,label"])
    groups = group_runs(find_runs([tmp_path])[0], ["partition.name", "label"])
    laid_out = panels(groups)
    assert [title for title, _ in laid_out] == ["dirichlet", "iid", "pathological"]
    assert all([g.key[-1] for g in members] == LABELS[:4] for _, members in laid_out)
    assert title_of(tmp_path / "report.png").startswith("test accuracy by partition.name, label")


def test_the_heading_names_the_settings_that_split_rows(tmp_path):
    write_run(tmp_path / "a", "fedavg", [0.1, 0.5, 0.6], rounds=2)
    write_run(tmp_path / "b", "fedavg", [0.1, 0.5, 0.6, 0.7], rounds=3)
    write_run(tmp_path / "c", "fedcsd", [0.1, 0.5, 0.6], rounds=2)
    groups = group_runs(find_runs([tmp_path])[0], ["label"])
    assert panels(groups) == [("", groups)]  # few rows: one panel, a legend beside it
    assert heading(groups, ["label"]) == (
        "test accuracy by label; rows also differ in rounds\n"
        "mean ± std over each row's runs (3 rows)")
