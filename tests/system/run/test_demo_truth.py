"""The demo config itself against the simulator's ground truth (support_desk, four presets).

`configs/demo.toml` is loaded through `load_config` and shrunk with overrides (one sample per
task, three of its six budgets, a temporary output path) so it runs in seconds; everything
that defines its data (provider, presets, environment and its 90 tasks, loop policy, seed)
is the demo's own.

What is compared, per (model, budget) cell: the measured truncation rate against the mean
over the 90 tasks of the probability that the call turn or the answer turn is cut
(`turn_cut_probability` of each). For every support_desk task the simulated policy
(`collector.sim.policy.decide`) makes all the calls the task needs in one turn (approval
tasks: `request_approval` and `refund` together) and then answers, so an episode is one
call turn and one answer turn.
`call_tokens` is the task's own calls in the preset's argument style, `answer_tokens` the
answer the policy gives once the calls succeeded (lookup answers quote the order status from
the task's metadata, which is what `lookup_order` returns). A call turn that is not cut but
writes malformed arguments (the preset's `malformed_prob`, decided per turn and independent
of length: sim-sloppy's 0.2) ends the episode before its answer turn, so the answer turn
counts only for the others. Not modelled, small: a preset's occasional wrong argument that
makes a tool fail and adds a retry turn (slightly more truncation than the truth). The
tolerance is the one of test_ground_truth.py, scaled to twelve cells: every truth inside its
cell's 99.9% Wilson interval, at most three outside the reported 95% interval (twelve
correct cells put four or more outside it under 1% of the time).

The demo exists to show both `stop_on` reasons: sim-sloppy's cells must show malformed
episodes, and the other presets' none.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.analysis.stats import compute_stats, wilson_interval
from collector.config import load_config
from collector.envs.base import Task
from collector.envs.support_desk import SupportDeskEnv
from collector.run.job import run_job
from collector.sim.policy import decide
from collector.sim.presets import PRESETS
from collector.sim.truth import answer_tokens_for, call_tokens_for, turn_cut_probability

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

DEMO = Path(__file__).resolve().parents[3] / "configs" / "demo.toml"
BUDGETS = [64, 96, 192]
TOOLS = frozenset({"lookup_order", "refund", "close_tickets", "send_email", "request_approval"})


def task_tokens(model: str, task: Task) -> tuple[int, int]:
    """(call tokens, answer tokens) of the task's call turn and answer turn for `model`."""
    plan = decide([("user", task.prompt)], TOOLS)
    assert plan.calls, task.prompt
    history: list[tuple[object, ...]] = [("user", task.prompt)]
    for i, call in enumerate(plan.calls):
        history.append(("call", f"c{i}", call.name, dict(call.arguments)))
        result = "ok"
        if call.name == "lookup_order":
            result = json.dumps({"order_id": task.metadata["order_id"], "status": task.metadata["status"]})
        history.append(("result", f"c{i}", call.name, result, False))
    final = decide(history, TOOLS)
    assert final.answer, task.prompt
    assert not final.calls, task.prompt
    calls = [(call.name, dict(call.arguments)) for call in plan.calls]
    return call_tokens_for(model, calls), answer_tokens_for(final.answer)


def expected_rate(model: str, budget: int, tasks: list[Task]) -> float:
    """Mean over the tasks of P(call turn cut, or answer turn reached and cut), from the simulator's truth."""
    reaches_answer = 1.0 - PRESETS[model].malformed_prob  # of the call turns not cut
    total = 0.0
    for task in tasks:
        call, answer = task_tokens(model, task)
        p_call = turn_cut_probability(model, budget, "call", call)
        p_answer = turn_cut_probability(model, budget, "answer", answer)
        total += p_call + (1.0 - p_call) * reaches_answer * p_answer
    return total / len(tasks)


def test_demo_config_agrees_with_simulator_truth(tmp_path: Path) -> None:
    """Each demo cell's truth lies in its 99.9% Wilson interval, and all but at most two in the 95%."""
    cfg = load_config(
        DEMO,
        [
            f"output.path={tmp_path / 'demo'}",
            "samples_per_task=1",
            f"sweep.budgets={BUDGETS}",
            "ray.cpus_per_worker=0.5",
            "ray.episodes_in_flight=32",
        ],
    )
    assert cfg.env.name == "support_desk"
    assert any(PRESETS[m].malformed_prob > 0 for m in cfg.sweep.models), "no preset writes malformed calls"
    num_tasks = cfg.env.options["num_tasks"]
    assert isinstance(num_tasks, int)
    tasks = list(SupportDeskEnv(num_tasks=num_tasks).tasks())
    run_job(cfg, show_progress=False)

    result = compute_stats(tmp_path / "demo", by=("model", "budget"))
    cells = {(g.key["model"], g.key["budget"]): g for g in result.groups}
    assert set(cells) == {(m, b) for m in cfg.sweep.models for b in BUDGETS}
    outside_95, outside_999 = [], []
    for (model, budget), group in sorted(cells.items()):
        assert group.episodes == len(tasks)
        assert (group.malformed > 0) == (PRESETS[model].malformed_prob > 0), (model, budget, group.malformed)
        truth = expected_rate(model, budget, tasks)
        low, high = group.truncation_interval
        wide_low, wide_high = wilson_interval(group.truncated, group.valid, z=3.29)
        where = f"{model}@{budget}: truth {truth:.3f}, measured {group.truncation_rate:.3f}"
        if not low <= truth <= high:
            outside_95.append(where)
        if not wide_low <= truth <= wide_high:
            outside_999.append(where)
    assert not outside_999, outside_999
    assert len(outside_95) <= 3, outside_95
