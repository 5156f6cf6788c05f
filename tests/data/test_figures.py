"""The notebook's figures (`collector.data.figures`): budget ticks, fixed colours, per-episode
waste, the picked budget, the error rate and reward against budget, read back from the axes."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from collector.analysis import stop_reason_mix, truncation_table, turn_truncation_table
from collector.data import figures
from collector.data.store import RunStore
from collector.stop import StopReason
from tests.data.factory import make_batch

S = StopReason
BUDGETS = [64, 96, 192]


def run_with(path: Path, mixes: dict[int, tuple[StopReason, ...]], model: str = "sim-perfect") -> Path:
    with RunStore.open(path, "fp", {}, "arrow", 64) as store:
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
