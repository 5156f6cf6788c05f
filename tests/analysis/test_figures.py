"""The notebook's figures (`collector.analysis.figures`): budget ticks, fixed colours, per-episode
waste, the picked budget, the error rate and reward against budget, the split by reasoning
setting, read back from the axes."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from collector.analysis import (
    figures,
    load_analysis,
    reasoning_grouping,
    stop_reason_mix,
    truncation_table,
    turn_truncation_table,
)
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from tests.record.factory import make_batch

S = StopReason
BUDGETS = [64, 96, 192]


def run_with(path: Path, mixes: dict[int, tuple[StopReason, ...]], model: str = "sim-perfect") -> Path:
    with LocalRunStore.open(path, "fp", {}, "arrow", 64) as store:
        for budget, stops in mixes.items():
            store.commit(make_batch(20, model=model, budget=budget, stops=stops))
    return path


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """One model at 64, 96 and 192: truncation falls with the budget, 96 has errors."""
    return run_with(tmp_path / "run", {
        64: (S.LENGTH, S.LENGTH, S.DONE, S.DONE),
        96: (S.LENGTH, S.DONE, S.ERROR, S.DONE, S.DONE),
        192: (S.DONE,),
    })


@pytest.fixture(autouse=True)
def close_figures() -> object:
    yield None
    plt.close("all")


def test_budget_axes_tick_exactly_the_budgets_swept(run: Path) -> None:
    """Every figure over budgets has a labelled tick at each swept budget (96 included) and no other."""
    trunc = truncation_table(run, target=0.3).to_pandas()
    per_turn = turn_truncation_table(run).to_pandas()
    drawn = [figures.truncation_figure(trunc, 0.3), figures.error_figure(trunc),
             figures.per_turn_figure(per_turn), figures.wasted_figure(trunc), figures.reward_figure(trunc)]
    axes = [ax for fig in drawn for ax in fig.axes]
    assert len(axes) == 7
    for ax in axes:
        assert list(ax.get_xticks()) == BUDGETS
        assert [t.get_text() for t in ax.get_xticklabels()] == ["64", "96", "192"]
        assert len(ax.xaxis.get_minorticklocs()) == 0


def test_a_stop_reason_has_one_colour_in_every_run(tmp_path: Path) -> None:
    """`length` is drawn in the same colour whichever other reasons a run holds."""
    a = run_with(tmp_path / "a", {64: (S.LENGTH, S.DONE)})
    b = run_with(tmp_path / "b", {64: (S.ERROR, S.MALFORMED_TOOL_CALL, S.LENGTH, S.MAX_STEPS, S.DONE)})
    colours = []
    for path in (a, b):
        ax = figures.stop_mix_figure(stop_reason_mix(path).to_pandas()).axes[0]
        handles, labels = ax.get_legend_handles_labels()
        colours.append({label: to_rgba(h.patches[0].get_facecolor())
                        for h, label in zip(handles, labels, strict=True)})
    assert colours[0]["length"] == colours[1]["length"] == to_rgba(figures.STOP_COLOURS["length"])
    assert colours[0]["done"] == colours[1]["done"]
    assert len({colours[1][r] for r in colours[1]}) == len(colours[1])  # five reasons, five colours


def test_wasted_tokens_are_per_episode_not_a_sum_per_cell() -> None:
    """A cell ten times larger with the same waste per episode plots at the same height."""
    trunc = pd.DataFrame({"model": ["m", "m"], "budget": [64, 128], "episodes": [10, 100],
                          "wasted_output_tokens": [1000, 10000], "wasted_fraction": [0.5, 0.5]})
    left = figures.wasted_figure(trunc).axes[0]
    assert list(left.get_lines()[0].get_ydata()) == [100.0, 100.0]


def test_the_budget_picked_for_the_target_is_marked(run: Path) -> None:
    """The smallest budget meeting the target (what `stats --target` picks) carries a marker at its rate."""
    trunc = truncation_table(run, target=0.3).to_pandas()
    picked = int(trunc["target_budget"].dropna().iloc[0])
    assert picked == 96
    ax = figures.truncation_figure(trunc, 0.3).axes[0]
    marks = [line for line in ax.get_lines() if line.get_label() == "sim-perfect: picked 96"]
    assert len(marks) == 1
    assert list(marks[0].get_xdata()) == [96]
    assert list(marks[0].get_ydata()) == [float(trunc.loc[trunc["budget"] == 96, "truncation_rate"].iloc[0])]


def test_error_rate_and_reward_are_drawn_against_budget(run: Path) -> None:
    """The error rate (left out of the truncation rate) and the mean reward each have a line per budget."""
    trunc = truncation_table(run).to_pandas().sort_values("budget")
    errors = figures.error_figure(trunc).axes[0].get_lines()[0]
    assert list(errors.get_xdata()) == BUDGETS
    assert list(errors.get_ydata()) == list(trunc["error_rate"])
    assert list(trunc["error_rate"]) == [0.0, 0.2, 0.0]
    graded = pd.DataFrame({"model": ["m", "m"], "budget": [64, 128], "mean_reward": [0.2, 0.5],
                           "done_rate": [0.9, 0.9]})
    reward = figures.reward_figure(graded).axes[0]
    assert [list(line.get_ydata()) for line in reward.get_lines()] == [[0.2, 0.5]]
    assert "reward" in reward.get_ylabel()


SETTINGS = {
    # effort=high thinks its cap away more often at 64; both hit the context window sometimes.
    "effort=low": {64: (S.LENGTH, S.DONE, S.DONE, S.CONTEXT_OVERFLOW),
                   128: (S.DONE, S.DONE, S.DONE, S.LENGTH)},
    "effort=high": {64: (S.LENGTH, S.LENGTH, S.CONTEXT_OVERFLOW, S.DONE),
                    128: (S.LENGTH, S.DONE, S.DONE, S.DONE)},
}


def reasoning_run(path: Path) -> Path:
    """One model, two reasoning settings x budgets 64 and 128 (20 episodes a cell): every cut
    turn of effort=high spent its cap on thinking, none of effort=low's did."""
    with LocalRunStore.open(path, "fp", {}, "arrow", 64) as store:
        for n, (setting, mixes) in enumerate(SETTINGS.items()):
            for budget, stops in mixes.items():
                batch = make_batch(20, model="sim-thinker", budget=budget, stops=stops, start=100 * n)
                for ep in batch:
                    ep.reasoning = setting
                    if setting == "effort=high" and ep.stop_reason is S.LENGTH:
                        ep.turns[-1].length_signals = ["finish_reason", "reasoning"]
                store.commit(batch)
    return path


def test_a_sweep_over_reasoning_settings_is_split_by_setting(tmp_path: Path) -> None:
    """With two reasoning settings the table has a row per setting and budget, the truncation
    figure a line per setting (named in the legend) with its thinking-cut rate beside it, and
    `context_overflow` its own column and colour in the stop mix."""
    run = reasoning_run(tmp_path / "run")
    by = reasoning_grouping(run)
    assert by == ("model", "budget", "reasoning")
    trunc = truncation_table(load_analysis(run), by=by, target=0.3).to_pandas()
    rows = {(r.reasoning, r.budget): r for r in trunc.itertuples()}
    assert sorted(rows) == [("effort=high", 64), ("effort=high", 128),
                            ("effort=low", 64), ("effort=low", 128)]
    assert rows[("effort=high", 64)].truncation_rate == 0.5
    assert rows[("effort=high", 64)].thinking_cut_rate == 0.5
    assert rows[("effort=low", 64)].thinking_cut_rate == 0.0
    assert rows[("effort=low", 64)].context_overflow_rate == 0.25
    assert rows[("effort=high", 128)].context_overflow_rate == 0.0

    ax = figures.truncation_figure(trunc, 0.3).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    high, low = lines["sim-thinker [effort=high]"], lines["sim-thinker [effort=low]"]
    assert list(high.get_ydata()) == [0.5, 0.25]
    assert list(low.get_ydata()) == [0.25, 0.25]
    assert high.get_marker() != low.get_marker()
    assert list(lines["sim-thinker [effort=high]: thinking cut"].get_ydata()) == [0.5, 0.25]
    assert "sim-thinker [effort=low]: thinking cut" not in lines  # no thinking cut: no line
    assert len(figures.reward_figure(trunc).axes[0].get_lines()) == 2

    mix = stop_reason_mix(load_analysis(run), by=by).to_pandas()
    stacks = figures.stop_mix_figure(mix).axes
    stack = stacks[0]
    handles, labels = stack.get_legend_handles_labels()
    colour = {label: to_rgba(h.patches[0].get_facecolor()) for h, label in zip(handles, labels, strict=True)}
    assert colour["context_overflow"] == to_rgba(figures.STOP_COLOURS["context_overflow"])
    assert len(set(colour.values())) == len(colour) == 3  # done, length, context_overflow
    assert len(stacks) == 2  # a panel per setting
    assert sum(len(ax.patches) for ax in stacks) == 3 * 4  # a bar per setting and budget, stacked by reason


def test_a_run_without_reasoning_settings_is_drawn_per_model_only(run: Path) -> None:
    """A run with no reasoning setting keeps the model x budget table and one line per model,
    with no thinking-cut line."""
    assert reasoning_grouping(run) == ("model", "budget")
    trunc = truncation_table(load_analysis(run), by=reasoning_grouping(run)).to_pandas()
    assert "reasoning" not in trunc
    labels = [line.get_label() for line in figures.truncation_figure(trunc).axes[0].get_lines()]
    assert labels == ["sim-perfect"]
