"""Truncation statistics: Wilson intervals, the per-group table against hand-computed values, formats."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from pathlib import Path

import pytest

from collector.analysis.stats import compute_stats, format_stats, wilson_interval
from collector.errors import ConfigError, OutputError
from collector.record.episode import Episode
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from tests.record.factory import make_batch, make_episode

S = StopReason


def test_wilson_interval_known_values() -> None:
    """Wilson 95% bounds match values worked out by hand, including 0 and n successes."""
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-4)
    assert high == pytest.approx(0.7634, abs=1e-4)
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert wilson_interval(10, 10) == (pytest.approx(0.7225, abs=1e-4), 1.0)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


def _cut_then_done(task: str) -> Episode:
    """A done episode whose first turn was cut (length not in stop_on): truncated, yet done."""
    ep = make_episode(S.DONE, model="a", budget=64, task=task)
    ep.turns[0].finish_class = "length"
    ep.turns[0].length_signals = ["cap_reached"]
    ep.turns[0].discarded = True
    return ep


def _hand_run(tmp_path: Path, fmt: str = "arrow") -> Path:
    """a/64: 4 length, 1 malformed, 3 done (one truncated), 2 error; a/256: 10 done; b/64: 5 done."""
    run = tmp_path / f"run-{fmt}"
    a64 = [make_episode(S.LENGTH, model="a", budget=64, task=f"l{i}") for i in range(4)]
    a64 += [make_episode(S.MALFORMED_TOOL_CALL, model="a", budget=64, task="m0")]
    a64 += [make_episode(S.DONE, model="a", budget=64, task=f"d{i}") for i in range(2)]
    a64 += [_cut_then_done("c0")]
    a64 += [make_episode(S.ERROR, model="a", budget=64, task=f"e{i}") for i in range(2)]
    with LocalRunStore.open(run, "fp", {}, fmt, 3) as st:  # type: ignore[arg-type]
        st.commit(a64)
        st.commit(make_batch(10, model="a", budget=256))
        st.commit(make_batch(5, model="b", budget=64))
    return run


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_table_matches_hand_computed_values(tmp_path: Path, fmt: str) -> None:
    """Every statistic of the model x budget table equals the value computed by hand."""
    result = compute_stats(_hand_run(tmp_path, fmt))
    rows = {(r["model"], r["budget"]): r for r in result.rows()}
    assert list(rows) == [("a", 64), ("a", 256), ("b", 64)]
    a = rows[("a", 64)]
    assert (a["episodes"], a["valid"], a["truncated"]) == (10, 8, 5)
    assert a["truncation_rate"] == pytest.approx(5 / 8)
    # Wilson by hand: p=.625, n=8, z^2=3.8415 -> centre .58446, half-width .27871.
    assert a["trunc_low"] == pytest.approx(0.3057, abs=1e-3)
    assert a["trunc_high"] == pytest.approx(0.8632, abs=1e-3)
    assert a["malformed_rate"] == pytest.approx(1 / 8)
    assert a["done_rate"] == pytest.approx(3 / 8)
    assert a["error_rate"] == pytest.approx(2 / 10)
    assert a["mean_reward"] == pytest.approx(3 / 8)
    # wasted: 4 cut turns x 64 + 1 malformed turn x 20 + 1 cut first turn x 30;
    # output: 4 x 94 + 50 + 3 x 35 + 2 x 30
    assert a["wasted_output_tokens"] == 306
    assert a["wasted_fraction"] == pytest.approx(306 / 591)
    b = rows[("b", 64)]
    assert (b["truncation_rate"], b["trunc_low"]) == (0.0, 0.0)
    assert b["trunc_high"] == pytest.approx(0.4345, abs=1e-4)
    assert b["mean_reward"] == 1.0
    assert result.episodes == 25


def test_smallest_budget_at_target(tmp_path: Path) -> None:
    """Per model, the smallest budget at or under the target, by point estimate and by upper bound."""
    run = _hand_run(tmp_path)
    picks = {p.key["model"]: p for p in compute_stats(run, target=0.3).picks}
    assert (picks["a"].budget, picks["a"].budget_confident) == (256, 256)  # 0/10: upper .2775
    assert (picks["b"].budget, picks["b"].budget_confident) == (64, None)  # 0/5: upper .4345
    picks = {p.key["model"]: p for p in compute_stats(run, target=0.7).picks}
    assert picks["a"].budget == 64
    tight = {p.key["model"]: p for p in compute_stats(run, target=0.0).picks}
    assert (tight["a"].budget, tight["a"].budget_confident) == (256, None)


def test_target_picks_without_budget_in_by(tmp_path: Path) -> None:
    """With `by` lacking budget the picks are still per model across budgets."""
    result = compute_stats(_hand_run(tmp_path), by=("model",), target=0.3)
    assert [r["model"] for r in result.rows()] == ["a", "b"]
    assert {p.key["model"]: p.budget for p in result.picks} == {"a": 256, "b": 64}


def test_group_by_other_columns(tmp_path: Path) -> None:
    """`by` accepts any scalar column, e.g. stop_reason or provider."""
    result = compute_stats(_hand_run(tmp_path), by=("stop_reason",))
    counts = {r["stop_reason"]: r["episodes"] for r in result.rows()}
    assert counts == {"done": 18, "error": 2, "length": 4, "malformed_tool_call": 1}
    by_provider = compute_stats(_hand_run(tmp_path / "p"), by=["provider", "model"]).rows()
    got = [(r["provider"], r["model"], r["episodes"]) for r in by_provider]
    assert got == [("chat", "a", 20), ("chat", "b", 5)]


def test_bad_arguments_are_config_errors(tmp_path: Path) -> None:
    """An unknown or nested --by column, or a target outside [0, 1], is a one-line ConfigError."""
    run = _hand_run(tmp_path)
    with pytest.raises(ConfigError, match="cannot group by 'nope'"):
        compute_stats(run, by=("nope",))
    with pytest.raises(ConfigError, match="cannot group by 'turns'"):
        compute_stats(run, by=("turns",))
    with pytest.raises(ConfigError, match="target"):
        compute_stats(run, target=5.0)
    with pytest.raises(OutputError, match="not a run directory"):
        compute_stats(tmp_path / "nothing-here")


def test_formats(tmp_path: Path) -> None:
    """table, csv and json carry the same numbers; NaN is empty in csv and null in json."""
    result = compute_stats(_hand_run(tmp_path), target=0.3)
    table = format_stats(result, "table")
    assert "62.5%" in table
    assert "[30.6, 86.3]" in table
    assert "a: budget 256 (measured 0.0%); with 95% confidence, budget 256 (upper bound 27.8%)" in table
    rows = list(csv.DictReader(io.StringIO(format_stats(result, "csv"))))
    assert float(rows[0]["truncation_rate"]) == pytest.approx(0.625)
    payload = json.loads(format_stats(result, "json"))
    assert payload["rows"][0]["truncated"] == 5
    pick = payload["picks"][1]
    assert (pick["key"], pick["budget"], pick["budget_confident"]) == ({"model": "b"}, 64, None)
    only_errors = compute_stats(_hand_run(tmp_path / "x"), by=("stop_reason",))
    rows_json = json.loads(format_stats(only_errors, "json"))["rows"]
    err = next(r for r in rows_json if r["stop_reason"] == "error")
    assert err["truncation_rate"] is None
    with pytest.raises(ConfigError):
        format_stats(result, "xml")  # type: ignore[arg-type]


def test_empty_run(tmp_path: Path) -> None:
    """A run with nothing committed gives an empty table, not an error."""
    LocalRunStore.open(tmp_path / "run", "fp", {}, "arrow", 3).close()
    result = compute_stats(tmp_path / "run", target=0.1)
    assert result.groups == []
    assert "0 episodes" in format_stats(result)


def test_uncommitted_files_are_not_counted(tmp_path: Path) -> None:
    """A shard on disk that the manifest does not name (a crash's orphan) never enters the statistics."""
    run = _hand_run(tmp_path)
    shard = next(run.glob("data/part-*.arrow"))
    shutil.copy(shard, shard.with_name("part-999999-orphan00.arrow"))
    assert compute_stats(run).episodes == 25
