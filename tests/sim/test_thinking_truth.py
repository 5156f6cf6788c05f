"""The thinking presets' ground truth: how often a turn is cut, and how often the cap goes to
thinking alone, match what the generator produces (within a 99% binomial interval)."""

from __future__ import annotations

import random

import pytest

from collector.sim.generate import generate
from collector.sim.policy import Plan
from collector.sim.presets import PRESETS
from collector.sim.truth import (
    REFERENCE_ANSWER,
    REFERENCE_CALL,
    binomial_interval,
    thinking_cut_probability,
    turn_cut_probability,
)

N = 2000


@pytest.mark.parametrize("step", ["call", "answer"])
@pytest.mark.parametrize("budget", [24, 60, 90, 200])
def test_thinking_cut_rate_matches_truth(step: str, budget: int) -> None:
    """Measured over the generator, the share of turns that spend the cap on thinking (cut, no
    text, no call) and the share cut at all fall inside the analytic truth's interval."""
    preset = PRESETS["sim-thinker"]
    plan = Plan(calls=(REFERENCE_CALL,)) if step == "call" else Plan(answer=REFERENCE_ANSWER)
    gens = [generate(plan, preset, budget, random.Random(budget * 7919 + i)) for i in range(N)]
    for measured, truth in (
        (sum(g.thinking_cut for g in gens), thinking_cut_probability("sim-thinker", budget, step)),  # type: ignore[arg-type]
        (sum(g.cut for g in gens), turn_cut_probability("sim-thinker", budget, step)),  # type: ignore[arg-type]
    ):
        lo, hi = binomial_interval(truth, N)
        assert lo <= measured <= hi, (budget, step, truth, measured)
    assert all(g.output_tokens <= budget for g in gens)  # thinking comes out of the same cap


def test_a_model_that_does_not_think_never_spends_the_cap_thinking() -> None:
    """Presets without `thinking` have a thinking-cut truth of 0 and generate no reasoning."""
    assert thinking_cut_probability("sim-terse", 4, "call") == 0.0
    gen = generate(Plan(calls=(REFERENCE_CALL,)), PRESETS["sim-terse"], 4, random.Random(1))
    assert gen.reasoning_tokens == 0
    assert not gen.thinking_cut
