"""The size figures: per model, the cumulative distribution of output tokens per turn and of each
tool's call size, with the sweep's budgets marked, in the report (inline SVG) and the notebook
(matplotlib), read back from what is drawn."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pyarrow.compute as pc
import pytest

from collector.analysis import figures, report
from collector.analysis.callsizes import ALL_TURNS, compute_size_curves, size_curve_table, size_curves
from collector.analysis.svgplot import step_value
from collector.analysis.tables import load_run
from collector.analysis.toolstats import compute_tool_stats
from collector.analysis.turnstats import compute_turn_stats
from collector.run.job import run_job
from tests.run.helpers import small_config

BUDGETS = [32, 256]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sim-tools on every support-desk kind (approval turns carry two calls), two budgets."""
    root = tmp_path_factory.mktemp("sizes")
    cfg = small_config(root / "run", sweep__models=["sim-tools", "sim-terse"], sweep__budgets=BUDGETS,
                       env__name="support_desk", env__tasks=10, samples_per_task=3)
    run_job(cfg, show_progress=False)
    return root / "run"


def test_curves_stop_at_the_largest_budget_below_one_by_its_cut_share(run: Path) -> None:
    """With one budget, a curve at the cap says what fits: 1 minus the cell's cut share of turns or calls."""
    top = BUDGETS[-1]
    table = load_run(run, columns=["model", "budget", "turns", "messages"])
    one = table.filter(pc.equal(table.column("budget"), top))
    curves = {(c.key["model"], c.series): c for c in size_curves(one)}
    groups = compute_tool_stats(run).groups
    tools = {(g.key["model"], g.key["tool"]): g for g in groups if g.key["budget"] == top}
    assert {k for k in curves if k[1] != ALL_TURNS} == set(tools)
    for key, g in tools.items():
        assert step_value(curves[key].points, top - 1) == pytest.approx(1 - g.cut / g.calls)
        complete = sorted(g.sizes)
        for t in (complete[0], complete[len(complete) // 2]) if complete else ():
            share = sum(s <= t for s in complete) / g.calls
            assert step_value(curves[key].points, t) == pytest.approx(share)
    kinds = [g for g in compute_turn_stats(run).groups if g.key["turn_kind"] is not None]
    turns = [g for g in kinds if g.key["budget"] == top]
    for model in ("sim-tools", "sim-terse"):
        cut = sum(g.cut for g in turns if g.key["model"] == model)
        total = sum(g.turns for g in turns if g.key["model"] == model)
        assert step_value(curves[(model, ALL_TURNS)].points, top - 1) == pytest.approx(1 - cut / total)


def test_curves_over_the_sweep_are_cumulative_and_mark_every_budget(run: Path) -> None:
    """Over several budgets each curve never falls, ends below the largest budget, and lists the budgets."""
    curves = compute_size_curves(run)
    assert {c.series for c in curves} >= {ALL_TURNS, "lookup_order", "send_email", "request_approval"}
    for c in curves:
        values = [p for _, p in c.points]
        assert values == sorted(values)
        assert all(0.0 <= v <= 1.0 for v in values)
        assert c.points[-1][0] == BUDGETS[-1] - 1
        assert c.budgets == BUDGETS


def test_report_draws_one_size_figure_per_model_with_every_budget_ruled(run: Path) -> None:
    """The report holds, per model, the size figure with a rule per swept budget, and the tool table."""
    page = report.build_report(run)
    svgs = [s for s in re.findall(r"<svg class=\"figure\".*?</svg>", page, re.S)
            if "Output tokens per turn and per tool call" in s]
    assert len(svgs) == 2
    for svg in svgs:
        rules = re.findall(r'<path class="target" d="M[\d.]+ \d+V\d+"/>', svg)
        assert len(rules) == len(BUDGETS)
        assert "<title>all turns</title>" in svg
    tools_svg = next(s for s in svgs if "send_email" in s)
    assert "<title>lookup_order</title>" in tools_svg
    assert '<table id="tools">' in page
    assert "Tasks cut far more than their cell" in page


def test_notebook_figure_has_a_panel_per_model_and_the_budgets_ruled(run: Path) -> None:
    """`figures.size_cdf_figure` draws one panel per model, a line per series, a vertical rule per budget."""
    frame = size_curve_table(run).to_pandas()
    fig = figures.size_cdf_figure(frame)
    try:
        axes = [ax for ax in fig.axes if ax.get_title()]
        assert sorted(ax.get_title() for ax in axes) == ["sim-terse", "sim-tools"]
        for ax in axes:
            series = set(frame[frame["model"] == ax.get_title()]["series"])
            labels = {line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")}
            assert labels == series
            rules = [line for line in ax.get_lines() if list(line.get_xdata()) in ([b, b] for b in BUDGETS)]
            assert len(rules) == len(BUDGETS)
            assert [int(t) for t in ax.get_xticks()] == BUDGETS
    finally:
        plt.close(fig)
