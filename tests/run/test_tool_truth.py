"""End to end against the simulator's per-tool truth: the per-tool and per-task tables are right.

`sim-tools` writes no text before its calls and pads each call's arguments with a known
number of whitespace tokens per tool (`lookup_order` short, `send_email` long), so the
chance that a call to a tool is cut at a cap, and the smallest cap that keeps the tool's
cuts at or under a target, are exact (`collector.sim.truth.tool_cut_probability`,
`tool_budget_for_target`). A sweep of support-desk lookup and e-mail tasks through the
in-process pool, the adapter, the loop and the shards must find them: the per-tool cut
rates and the per-task rates within their intervals (every count inside the exact 99.9%
band of its truth, almost every truth inside the reported 95% interval), each tool's true
budget inside the reported budget interval, the long tool flagged when the sweep stops short
of its budget, and the e-mail tasks named as the ones cut far more than their cell.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from collector.analysis.stats import wilson_interval
from collector.analysis.tables import load_run
from collector.analysis.taskstats import compute_task_stats
from collector.analysis.toolstats import aggregate_tools, compute_tool_stats
from collector.envs.base import Task
from collector.run.job import run_job
from collector.sim.truth import (
    binomial_interval,
    call_tokens_for,
    tool_budget_for_target,
    tool_cut_probability,
)
from tests.run.helpers import small_config
from tests.run.tool_env import LookupAndEmail
from tests.untraced import untraced

MODEL = "sim-tools"
BUDGETS = [32, 128, 256, 512]
SAMPLES = 40
TARGET = 0.05
TOOL_OF = {"lookup": "lookup_order", "email": "send_email"}


def _tasks() -> list[Task]:
    return list(LookupAndEmail(num_tasks=8).tasks())


def _call_tokens(task: Task) -> int:
    """The task's call size without padding, as the simulator's policy writes it."""
    m = task.metadata
    if m["kind"] == "lookup":
        return call_tokens_for(MODEL, [("lookup_order", {"order_id": m["order_id"]})])
    email = {"to": m["to"], "subject": m["subject"], "body": m["body"]}
    return call_tokens_for(MODEL, [("send_email", email)])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tooltruth")
    cfg = small_config(root / "run", sweep__models=[MODEL], sweep__budgets=BUDGETS,
                       env__name="tests.run.tool_env:LookupAndEmail", env__tasks=None,
                       env__options={"num_tasks": 8}, samples_per_task=SAMPLES,
                       ray__episodes_in_flight=32, ray__batch_size=32, output__rows_per_shard=512)
    with untraced():  # a sample's worth of episodes over lines every job test covers
        run_job(cfg, show_progress=False)
    return root / "run"


def _misses(checks: list[tuple[str, float, int, int]]) -> tuple[list[str], list[str]]:
    """Of (label, truth, hits, n): those whose truth lies outside the reported Wilson 95% interval,
    and those whose count lies outside the exact 99.9% band of Binomial(n, truth)."""
    outside_95, outside_999 = [], []
    for label, truth, hits, n in checks:
        low, high = wilson_interval(hits, n)
        band_low, band_high = binomial_interval(truth, n, 0.999)
        where = f"{label}: truth {truth:.3f}, measured {hits / n:.3f}"
        if not low <= truth <= high:
            outside_95.append(where)
        if not band_low <= hits <= band_high:
            outside_999.append(where)
    return outside_95, outside_999


def _sizes_by_tool() -> dict[str, list[int]]:
    sizes: dict[str, list[int]] = {}
    for task in _tasks():
        sizes.setdefault(TOOL_OF[task.metadata["kind"]], []).append(_call_tokens(task))
    return sizes


def test_per_tool_cut_rates_agree_with_simulator_truth(run: Path) -> None:
    """Each tool's cut count per budget is in its truth's 99.9% band; all but one truth in the 95% CI."""
    result = compute_tool_stats(run)
    rows = {(g.key["budget"], g.key["tool"]): g for g in result.groups}
    assert set(rows) == {(b, tool) for b in BUDGETS for tool in TOOL_OF.values()}
    assert not result.unattributed  # no preamble: every cut turn shows the call it was writing
    checks = []
    for (budget, tool), g in sorted(rows.items()):
        fixed = _sizes_by_tool()[tool]
        truth = sum(tool_cut_probability(MODEL, tool, budget, f) for f in fixed) / len(fixed)
        assert g.calls == SAMPLES * len(fixed)
        checks.append((f"{tool}@{budget}", truth, g.cut, g.calls))
    outside_95, outside_999 = _misses(checks)
    assert not outside_999, outside_999
    assert len(outside_95) <= 1, outside_95
    # The sizes are those of complete calls only: none reaches its cell's cap.
    assert all(max(g.sizes, default=0) < g.key["budget"] for g in result.groups)


def test_per_tool_budget_interval_holds_the_true_budget(run: Path) -> None:
    """Each tool's true budget for a 5% target lies in the reported budget interval."""
    result = compute_tool_stats(run, target=TARGET)
    answers = {b.key["tool"]: b for b in result.budgets}
    for tool, fixed in _sizes_by_tool().items():
        truth = tool_budget_for_target(MODEL, tool, TARGET, fixed)
        answer = answers[tool]
        assert not answer.fits_no_budget, tool
        assert answer.budget_low is not None
        assert answer.budget_high is not None
        assert answer.budget_low <= truth <= answer.budget_high, (tool, truth, answer)
    assert answers["lookup_order"].budget_high < answers["send_email"].budget_low  # type: ignore[operator]


def test_long_tool_is_flagged_when_the_sweep_stops_short(run: Path) -> None:
    """With the sweep cut at 256, the long tool (true budget above it) fits no budget; the short one does."""
    table = load_run(run, columns=["model", "budget", "turns", "messages"])
    short = table.filter(table.column("budget").to_numpy() <= 256)
    answers = {b.key["tool"]: b for b in aggregate_tools(short, ("model", "budget"), TARGET).budgets}
    assert tool_budget_for_target(MODEL, "send_email", TARGET, _sizes_by_tool()["send_email"]) > 256
    assert answers["send_email"].fits_no_budget
    assert not answers["lookup_order"].fits_no_budget


def test_per_task_rates_agree_with_truth_and_name_the_long_tasks(run: Path) -> None:
    """Each task's rate holds its truth; the tasks cut far more than their cell are the e-mail ones."""
    result = compute_task_stats(run)
    by_id = {t.id: t for t in _tasks()}
    checks = []
    for row in result.rows:
        task = by_id[row.key["task_id"]]
        tool = TOOL_OF[task.metadata["kind"]]
        truth = tool_cut_probability(MODEL, tool, row.key["budget"], _call_tokens(task))
        checks.append((f"{task.id}@{row.key['budget']}", truth, row.truncated, row.episodes))
    outside_95, outside_999 = _misses(checks)
    assert not outside_999, outside_999
    assert len(outside_95) <= 3, outside_95  # of 32 rows, most of them certain (truth 0 or 1)
    clustered = result.clustered()
    assert clustered
    assert all(by_id[r.key["task_id"]].metadata["kind"] == "email" for r in clustered)
    at_32 = {r.key["task_id"] for r in clustered if r.key["budget"] == 32}
    assert at_32 == {t.id for t in _tasks() if t.metadata["kind"] == "email"}
    rates = [r.truncation_rate for r in result.rows if r.key["budget"] == 128]
    assert rates == sorted(rates, reverse=True)


def test_python_tables_match_the_cli_tables(run: Path) -> None:
    """`tool_truncation_table` / `task_truncation_table` hold the rows `stats --per tool/task` prints."""
    from collector.analysis.tables import task_truncation_table, tool_truncation_table

    def same(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:  # NaN (no complete call) != NaN
        return [{k: None if v != v else v for k, v in r.items()} for r in rows]

    tools = tool_truncation_table(run, target=TARGET).to_pylist()
    assert same(tools) == same(compute_tool_stats(run, target=TARGET).rows())
    assert {r["tool"] for r in tools} == set(TOOL_OF.values())
    tasks = task_truncation_table(run).to_pylist()
    assert len(tasks) == len(_tasks()) * len(BUDGETS)
    assert sum(r["clustered"] for r in tasks) == len(compute_task_stats(run).clustered())
