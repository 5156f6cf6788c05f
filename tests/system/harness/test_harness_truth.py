"""A harness sweep's truncation table against the simulator's analytic truth.

configs/harness_openai.toml runs through `collector run` on the in-process pool over two
models and two budgets, its harness the same arithmetic tool loop as the config's `openai` SDK
loop written with the standard library (stdlib_tool_loop.py: a process that starts in 0.03 s
of CPU where importing the SDK takes 0.8 s, so a sweep can have the episodes a rate needs);
the rate
`collector stats` reports per model x budget must be the simulator's: for each cell, the mean
over its tasks of the probability that the call turn or the answer turn is cut
(`collector.sim.truth`). The gateway, not the loop, classifies these turns, and
`sim-hidden-cut` reports a cut call as `tool_calls`: a gateway that missed hidden cuts, or
let an episode run on past its cut turn, would show another rate. The same acceptance rule
as the loop's own ground-truth test (tests/run/test_ground_truth.py): every truth inside its
cell's 99.9% Wilson interval, at most one outside the 95% interval the table reports
(tests/truth_cells.py).

400 episodes, about 30 s of CPU, nearly all of it the episodes' processes (the loop and its
supervisor, collector/harness/reaper.py). Not fewer: the intervals widen as one over the root
of the tasks per cell, and with them the wrong rates this rule lets pass.
"""

from __future__ import annotations

import json
from pathlib import Path

from collector.analysis.stats import compute_stats
from collector.cli import main
from collector.envs.arithmetic import ArithmeticEnv
from collector.sim.truth import answer_tokens_for, call_tokens_for, episode_truncation_probability
from tests.truth_cells import cells_off_truth
from tests.untraced import untraced

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "harness_openai.toml"
LOOP = Path(__file__).with_name("stdlib_tool_loop.py")
MODELS = ["sim-hidden-cut", "sim-terse"]
BUDGETS = [20, 32]  # sim-hidden-cut: a sixth of its episodes have a cut reported as `tool_calls`
TASKS = 100


def _truth(model: str, budget: int, tasks: list[tuple[str, str]]) -> float:
    """Mean over the tasks of P(call or answer turn cut): one calculator call, then the number."""
    return sum(
        episode_truncation_probability(
            model, budget, 1,
            call_tokens=call_tokens_for(model, [("calculator", {"expression": expression})]),
            answer_tokens=answer_tokens_for(answer),
        )
        for expression, answer in tasks
    ) / len(tasks)


def test_a_harness_sweeps_truncation_table_agrees_with_the_simulators_truth(tmp_path: Path) -> None:
    """Per model x budget, harness episodes are truncated at the rate the simulator states analytically."""
    tasks = ArithmeticEnv(num_tasks=TASKS, seed=11).tasks()
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text("".join(json.dumps({"id": t.id, "prompt": t.prompt}) + "\n" for t in tasks))
    run = tmp_path / "run"
    with untraced():  # samples over lines the other tests cover (tests/untraced.py)
        status = main([
            "run", str(CONFIG), "--in-process", "--quiet",
            "--set", f'output.path="{run}"', "--set", f'env.task_file="{task_file}"',
            "--set", f"sweep.models={json.dumps(MODELS)}", "--set", f"sweep.budgets={BUDGETS}",
            "--set", f'env.options.command=["{{python}}", "-S", "{LOOP}", "{{task}}"]',
            "--set", "ray.episodes_in_flight=16",
        ])
    assert status == 0
    result = compute_stats(run, by=("model", "budget"))
    cells = {(g.key["model"], g.key["budget"]): g for g in result.groups}
    assert set(cells) == {(m, b) for m in MODELS for b in BUDGETS}
    graded = [(str(t.metadata["expression"]), str(t.metadata["answer"])) for t in tasks]
    for group in cells.values():
        assert group.episodes == TASKS
        assert group.valid == TASKS  # no harness crashed: every episode counts
    outside_95, outside_999 = cells_off_truth(cells, lambda model, budget: _truth(model, budget, graded))
    assert not outside_999, outside_999
    assert len(outside_95) <= 1, outside_95
