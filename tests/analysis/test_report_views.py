"""Looking at results as a person would: the transcript list names tasks, `show` says what
`trainable` means, `collector report A B` compares two runs cell by cell, and the notebook's
figures are small multiples a reader can tell apart, with the output-length figure that a
budget is picked from. (The page at 1400 px in a browser: tests/system/analysis/test_report_width.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from collector.analysis import figures, load_analysis, stop_reason_mix, turn_truncation_table
from collector.analysis.episodes import render_transcript
from collector.cli import main
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from tests.record.factory import make_batch, make_episode

S = StopReason
MODELS = ("m-a", "m-b", "m-c")
BUDGETS = (64, 128, 256)


def _run(path: Path, stops: tuple[StopReason, ...]) -> Path:
    with LocalRunStore.open(path, "fp", {}, "arrow", 64) as store:
        for model in MODELS:
            for budget in BUDGETS:
                store.commit(make_batch(12, model=model, budget=budget, stops=stops))
    return path


@pytest.fixture(autouse=True)
def close_figures() -> object:
    yield None
    plt.close("all")


def test_show_says_what_trainable_means() -> None:
    """`show` explains trainable: a cut episode is a training row with reward 0, an error is left out."""
    cut = render_transcript(make_episode(S.LENGTH))
    assert "trainable yes (a training row with reward 0: the model's own length)" in cut
    failed = render_transcript(make_episode(S.ERROR))
    assert "trainable no (ended as error: a failure or a clock, not the model's doing" in failed


def test_transcript_list_names_each_task(tmp_path: Path) -> None:
    """Every transcript's one-line summary in the report names its task and sample."""
    run = _run(tmp_path / "run", (S.LENGTH, S.DONE))
    out = tmp_path / "r.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    summaries = re.findall(r"<summary>(.*?)</summary>", out.read_text(encoding="utf-8"))
    assert summaries
    assert all(re.search(r" · task t\d+ #\d+ · ", s) for s in summaries)


def test_report_of_two_runs_compares_them_cell_by_cell(tmp_path: Path) -> None:
    """`collector report A B` adds a table of both runs' truncation per cell, the change marked."""
    a = _run(tmp_path / "a", (S.LENGTH, S.LENGTH, S.LENGTH, S.DONE))
    b = _run(tmp_path / "b", (S.DONE,))
    out = tmp_path / "ab.html"
    assert main(["report", str(a), str(b), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    table = page.split('<table id="comparison">', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr( class=\"pick\")?>(.*?)</tr>", table.split("<tbody>", 1)[1])
    assert len(rows) == len(MODELS) * len(BUDGETS)
    assert all(marked for marked, _ in rows)  # 75% against 0% of 12: the intervals are apart
    assert "75.0% [" in rows[0][1]
    assert "-75.0%" in rows[0][1]
    assert main(["report", str(a), "-o", str(tmp_path / "a.html")]) == 0
    assert 'id="comparison"' not in (tmp_path / "a.html").read_text(encoding="utf-8")


def test_notebook_figures_are_small_multiples(tmp_path: Path) -> None:
    """Per-turn and stop-mix figures draw one panel per model, so no panel holds a dozen bands or bars."""
    episodes = load_analysis(_run(tmp_path / "run", (S.LENGTH, S.DONE, S.MALFORMED_TOOL_CALL)))
    per_turn = figures.per_turn_figure(turn_truncation_table(episodes, by=("model", "budget")).to_pandas())
    titled = [ax for ax in per_turn.axes if ax.get_title()]
    assert sorted(ax.get_title() for ax in titled) == sorted(MODELS)
    assert all(len(ax.collections) <= 4 for ax in per_turn.axes)  # bands per panel
    mix = figures.stop_mix_figure(stop_reason_mix(episodes, by=("model", "budget")).to_pandas())
    assert sorted(ax.get_title() for ax in mix.axes) == sorted(MODELS)
    for ax in mix.axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == [str(b) for b in BUDGETS]


def test_output_length_figure_marks_every_budget(tmp_path: Path) -> None:
    """The output-length figure has a panel per model with every swept budget marked and labelled."""
    episodes = load_analysis(_run(tmp_path / "run", (S.LENGTH, S.DONE)))
    lengths = figures.turn_lengths(episodes)
    assert set(lengths.columns) == {"model", "budget", "output_tokens", "cut"}
    fig = figures.output_length_figure(lengths)
    assert len(fig.axes) == len(MODELS)
    for ax in fig.axes:
        marked = sorted({round(line.get_xdata()[0]) for line in ax.get_lines()
                         if line.get_linestyle() == "--"})
        assert marked == list(BUDGETS)
        assert len(ax.texts) == len(BUDGETS)  # the share each budget would cut, written at it
