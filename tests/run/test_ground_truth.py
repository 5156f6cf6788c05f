"""End to end against the simulator's ground truth: the measured truncation table is right.

A sweep through the Ray job, the provider adapter, the episode loop, the shards and
`compute_stats` must find the truncation rate the simulator states analytically: for each
(model, budget) cell, the mean over its episodes of the probability that the call turn or
the answer turn is cut. With six cells, six 95% intervals all cover their truth only about
74% of the time even when everything is right, so the test asks for what a correct
pipeline gives reliably: every truth inside its cell's 99.9% Wilson interval, and at most
one outside the 95% interval the table reports. `sim-hidden-cut`
reports a cut call as `tool_calls` (like vLLM), so this also pins that hidden cuts count.
"""

from __future__ import annotations

from pathlib import Path

from collector.analysis.stats import compute_stats, wilson_interval
from collector.envs.arithmetic import ArithmeticEnv
from collector.run.job import run_job
from collector.sim.truth import answer_tokens_for, call_tokens_for, episode_truncation_probability
from tests.run.helpers import small_config
from tests.untraced import untraced

MODELS = ["sim-hidden-cut", "sim-verbose"]
BUDGETS = [48, 96, 160]
TASKS = 100


def expected_rate(model: str, budget: int) -> float:
    """Mean over the arithmetic tasks of P(call or answer turn cut), from the simulator's truth."""
    total = 0.0
    tasks = ArithmeticEnv(num_tasks=TASKS).tasks()
    for task in tasks:
        expression, answer = task.metadata["expression"], task.metadata["answer"]
        total += episode_truncation_probability(
            model,
            budget,
            1,
            call_tokens=call_tokens_for(model, [("calculator", {"expression": expression})]),
            answer_tokens=answer_tokens_for(str(answer)),
        )
    return total / len(tasks)


def test_truncation_table_agrees_with_simulator_truth(tmp_path: Path) -> None:
    """Each cell's truth lies in its 99.9% Wilson interval, and all but at most one in the reported 95%."""
    cfg = small_config(
        tmp_path / "run",
        sweep__models=MODELS,
        sweep__budgets=BUDGETS,
        env__tasks=None,
        env__options={"num_tasks": TASKS},
        samples_per_task=2,
        ray__episodes_in_flight=32,
        ray__batch_size=32,
        output__rows_per_shard=256,
    )
    with untraced():  # a sample's worth of episodes over lines every job test covers
        run_job(cfg, show_progress=False)
    result = compute_stats(tmp_path / "run", by=("model", "budget"))
    cells = {(g.key["model"], g.key["budget"]): g for g in result.groups}
    assert set(cells) == {(m, b) for m in MODELS for b in BUDGETS}
    outside_95, outside_999 = [], []
    for (model, budget), group in sorted(cells.items()):
        assert group.episodes == 2 * TASKS
        truth = expected_rate(model, budget)
        low, high = group.truncation_interval
        wide_low, wide_high = wilson_interval(group.truncated, group.valid, z=3.29)
        where = f"{model}@{budget}: truth {truth:.3f}, measured {group.truncation_rate:.3f}"
        if not low <= truth <= high:
            outside_95.append(where)
        if not wide_low <= truth <= wide_high:
            outside_999.append(where)
    assert not outside_999, outside_999
    assert len(outside_95) <= 1, outside_95
