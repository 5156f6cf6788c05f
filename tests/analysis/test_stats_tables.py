"""`collector stats` hides nothing: every stop reason, every provider, the target picks in every
format, retries per cell, a target line in words, and the per-turn table (`--per turn`)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from collector.analysis import truncation_table, turn_truncation_table
from collector.cli import main
from collector.record.episode import Episode
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from tests.record.factory import make_episode

S = StopReason


def _store(run: Path, episodes: list[Episode]) -> Path:
    with LocalRunStore.open(run, "fp", {}, "arrow", 64) as st:
        st.commit(episodes)
    return run


def _stats(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["stats", *args]) == 0
    return capsys.readouterr().out


def test_max_steps_and_timeout_get_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With loop.max_steps = 1 every episode ends max_steps: the table says so instead of showing 0% x 3."""
    eps = [make_episode(S.MAX_STEPS, model="m", budget=64, task=f"t{i}") for i in range(3)]
    eps.append(make_episode(S.TIMEOUT, model="m", budget=64, task="slow"))
    out = _stats(capsys, str(_store(tmp_path / "run", eps)))
    header, _, row = out.splitlines()[:3]
    assert header.split()[-7:] == ["max_steps", "timeout", "error", "reward", "wasted", "tok", "wasted"]
    assert "75.0%" in row  # 3 of 4 max_steps
    assert "25.0%" in row  # 1 of 4 timeout
    assert "length" not in header  # a reason that does not occur gets no column
    rows = json.loads(_stats(capsys, str(tmp_path / "run"), "--format", "json"))["rows"]
    assert (rows[0]["max_steps_rate"], rows[0]["timeout_rate"], rows[0]["length_rate"]) == (0.75, 0.25, 0.0)


def test_a_provider_sweep_is_not_pooled(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With several providers the default table has one row per provider x model x budget."""
    eps = [make_episode(S.DONE, model="m", budget=64, task=f"{p}{i}", provider=p)
           for p in ("vllm", "openai") for i in range(2)]
    out = _stats(capsys, str(_store(tmp_path / "run", eps)), "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["provider"], r["episodes"]) for r in rows] == [("openai", "2"), ("vllm", "2")]
    single = _stats(capsys, str(_store(tmp_path / "one", eps[:2])), "--format", "csv")
    assert "provider" not in single.splitlines()[0]  # one provider: the column adds nothing


def test_csv_and_arrow_carry_the_target_picks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--format csv and truncation_table(target=...) carry each row's pick, as json always did."""
    eps = [make_episode(S.LENGTH, model="m", budget=32, task=f"c{i}") for i in range(4)]
    eps += [make_episode(S.DONE, model="m", budget=256, task=f"d{i}") for i in range(20)]
    run = _store(tmp_path / "run", eps)
    rows = list(csv.DictReader(io.StringIO(_stats(capsys, str(run), "--format", "csv", "--target", "0.2"))))
    assert [(r["budget"], r["target"], r["target_budget"], r["target_budget_confident"]) for r in rows] == [
        ("32", "0.2", "256", "256"), ("256", "0.2", "256", "256")]
    table = truncation_table(run, target=0.2)
    assert table.column("target_budget").to_pylist() == [256, 256]
    assert table.column("target_budget_confident").to_pylist() == [256, 256]


def test_retries_and_errors_per_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each cell reports its retried requests by cause and its error episodes; a calm cell shows none."""
    stormy = [make_episode(S.DONE, model="m", budget=64, task=f"s{i}") for i in range(3)]
    stormy[0].retries = ["429", "429", "5xx"]
    stormy[1].retries = ["timeout", "dropped"]
    failed = make_episode(S.ERROR, model="m", budget=64, task="e0")
    failed.retries = ["5xx", "5xx", "5xx", "5xx"]
    calm = [make_episode(S.DONE, model="m", budget=128, task=f"c{i}") for i in range(3)]
    run = _store(tmp_path / "run", [*stormy, failed, *calm])
    out = _stats(capsys, str(run)).splitlines()
    assert out[0].split()[-1] == "retried"
    assert out[2].endswith("9 (429: 2, 5xx: 5, timeout: 1, dropped: 1)")
    assert "25.0% (1)" in out[2]  # the error share and count
    assert out[3].endswith("  0")
    summary = next(line for line in out if "requests retried" in line)
    assert summary.endswith("; 9 requests retried (429: 2, 5xx: 5, timeout: 1, dropped: 1)")
    assert out[-1] == "  m, 64: ProviderUnavailable 1"  # the error episode's cause, under its cell
    rows = json.loads(_stats(capsys, str(run), "--format", "json"))["rows"]
    assert [(r["retries"], r["retries_5xx"], r["errors"]) for r in rows] == [(9, 5, 1), (0, 0, 0)]


def test_target_line_says_what_was_asked_and_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The --target line names the target and, when no budget meets it, what came closest."""
    eps = [make_episode(S.LENGTH, model="gemma3-270m", budget=b, task=f"t{i}") for b in (4, 16, 48)
           for i in range(3)]
    eps[-1] = make_episode(S.DONE, model="gemma3-270m", budget=48, task="t2")
    out = _stats(capsys, str(_store(tmp_path / "run", eps)), "--target", "5%")
    assert "target: truncation at or under 5.0% of episodes; the smallest budget that meets it:" in out
    assert ("gemma3-270m: none of the 3 budgets measured (4 to 48) meets 5.0%; the lowest truncation "
            "is 66.7%, at budget 48") in out
    assert "none of the budgets; none of the budgets" not in out


def _rambling(model: str, budget: int, task: str, call_cut: bool) -> Episode:
    """An episode whose call turn fits (or not) and whose answer turn is always cut."""
    ep = make_episode(S.LENGTH, model=model, budget=budget, task=task)
    if call_cut:
        ep.turns[0].finish_class = "length"
    ep.turns[1].num_tool_calls = 0  # the cut turn is the rambling answer
    return ep


def test_per_turn_table_separates_the_call_from_the_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--per turn shows the call fitting at 48 while every answer is cut; per episode both read 100%."""
    eps = [_rambling("m", 16, f"t{i}", call_cut=i < 3) for i in range(4)]
    eps += [_rambling("m", 48, f"t{i}", call_cut=False) for i in range(4)]
    run = _store(tmp_path / "run", eps)
    episode_rows = json.loads(_stats(capsys, str(run), "--format", "json"))["rows"]
    assert [r["truncation_rate"] for r in episode_rows] == [1.0, 1.0]
    per_turn = _stats(capsys, str(run), "--per", "turn", "--format", "json", "--target", "0.1")
    rows = json.loads(per_turn)["rows"]
    got = {(r["budget"], r["turn_index"] if r["turn_index"] is not None else r["turn_kind"]):
           (r["turns"], r["cut"]) for r in rows}
    assert got == {(16, 0): (4, 3), (16, 1): (4, 4), (16, "call"): (4, 3), (16, "answer"): (4, 4),
                   (48, 0): (4, 0), (48, 1): (4, 4), (48, "call"): (4, 0), (48, "answer"): (4, 4)}
    first = next(r for r in rows if r["budget"] == 16 and r["turn_index"] == 0)
    assert first["cut_rate"] == 0.75
    assert first["cut_low"] == pytest.approx(0.3006, abs=1e-3)  # Wilson 3/4 by hand
    assert (first["target_budget"], first["target_budget_confident"]) == (48, None)
    table = _stats(capsys, str(run), "--per", "turn", "--target", "0.1")
    assert "m, turn 0: budget 48 (measured 0.0%)" in table
    assert "m, answer turns: none of the 2 budgets measured (16 to 48) meets 10.0%" in table
    arrow = turn_truncation_table(run)
    assert arrow.column("turn_kind").to_pylist()[2:4] == ["call", "answer"]


def test_a_parquet_run_without_the_retries_column_still_reads(tmp_path: Path) -> None:
    """Shards written before schema 3 (no `retries`) still give the table, with no retries counted."""
    import pyarrow.parquet as pq

    from collector.analysis.stats import compute_stats
    from collector.storage.manifest import committed_shard_paths

    run = tmp_path / "run"
    with LocalRunStore.open(run, "fp", {}, "parquet", 64) as st:
        st.commit([make_episode(S.DONE, model="m", budget=64, task=f"t{i}") for i in range(3)])
    for path in committed_shard_paths(run):
        pq.write_table(pq.read_table(path).drop_columns(["retries"]), path)
    rows = compute_stats(run).rows()
    assert [(r["episodes"], r["retries"]) for r in rows] == [(3, 0)]
    assert truncation_table(run).column("retries").to_pylist() == [0]
