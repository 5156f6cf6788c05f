"""Ground truth: each preset's measured cut rate sits inside the 99% binomial band of its stated truth."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random

import httpx
import pytest

from collector.sim.app import simulate
from collector.sim.generate import generate
from collector.sim.plans import PlannedCall
from collector.sim.policy import Plan
from collector.sim.presets import PRESETS, LengthDist
from collector.sim.truth import (
    REFERENCE_ANSWER,
    REFERENCE_CALL,
    binomial_interval,
    episode_truncation_probability,
    turn_cut_probability,
)
from tests.sim.conftest import ARITH, chat_body
from tests.sim.curve import nearest_budget
from tests.untraced import untraced

N = 2000


def _budgets(model: str, step: str) -> list[int]:
    """Three budgets whose truth is nearest 0.8, 0.5 and 0.2 (or the step's edges for a step function)."""
    def truth(budget: int) -> float:
        return turn_cut_probability(model, budget, step)  # type: ignore[arg-type]

    return sorted({nearest_budget(truth, target, 1, 600) for target in (0.8, 0.5, 0.2)})


@pytest.mark.parametrize("step", ["call", "answer"])
@pytest.mark.parametrize("model", sorted(PRESETS))
def test_measured_cut_rate_matches_truth(model: str, step: str) -> None:
    """Over 2,000 generated turns at three budgets the cut count lies in the 99% band of the truth."""
    preset = PRESETS[model]
    plan = Plan(calls=(REFERENCE_CALL,)) if step == "call" else Plan(answer=REFERENCE_ANSWER)
    budgets = _budgets(model, step)
    assert len(budgets) >= 2
    if (preset.preamble, preset.answer_preamble) != (LengthDist(), LengthDist()):  # not a step function
        assert len(budgets) == 3
    for budget in budgets:
        truth = turn_cut_probability(model, budget, step)  # type: ignore[arg-type]
        with untraced():  # samples over lines the other tests cover (tests/untraced.py)
            cuts = sum(generate(plan, preset, budget, random.Random(budget * 7919 + i)).cut for i in range(N))
        lo, hi = binomial_interval(truth, N)
        assert lo <= cuts <= hi, (model, step, budget, truth, cuts)


def test_call_step_truncation_falls_smoothly_with_budget() -> None:
    """For every preset with text, the call-step cut rate never rises with the budget and spans 16..256."""
    for model in ("sim-terse", "sim-verbose", "sim-leaky", "sim-hidden-cut", "sim-sloppy"):
        curve = [turn_cut_probability(model, b, "call") for b in range(1, 512)]
        assert all(a >= b for a, b in itertools.pairwise(curve))
        assert turn_cut_probability(model, 16, "call") > 0.3
        assert turn_cut_probability(model, 256, "call") < 0.05


def test_a_wrong_argument_changes_one_number_or_string_by_one_character() -> None:
    """A preset's error draw (a wrong value, not broken JSON) bumps a number's last digit or flips
    a string's first letter; a call with no number or string argument is sent as planned."""
    preset = dataclasses.replace(PRESETS["sim-perfect"], error_rate=1.0)
    cases = [
        ((("order_id", "A-1001"),), {"order_id": "A-1002"}),
        ((("amount", 750),), {"amount": 751}),
        ((("reason", "late"),), {"reason": "Late"}),
        ((("labels", ["a"]), ("urgent", True)), {"labels": ["a"], "urgent": True}),
    ]
    for arguments, sent in cases:
        plan = Plan(calls=(PlannedCall("tool", arguments),))
        (call,) = generate(plan, preset, 4096, random.Random(3)).calls
        assert json.loads(call.arguments) == sent, arguments


def test_episode_probability_combines_turns() -> None:
    """An episode of k calls and an answer is cut unless every turn fits."""
    pc = turn_cut_probability("sim-terse", 24, "call")
    pa = turn_cut_probability("sim-terse", 24, "answer")
    assert episode_truncation_probability("sim-terse", 24, 2) == pytest.approx(1 - (1 - pc) ** 2 * (1 - pa))
    assert episode_truncation_probability("sim-perfect", 4096, 3) == 0.0


def test_binomial_interval_holds_its_mass() -> None:
    """The band is central and contains at least the stated mass."""
    lo, hi = binomial_interval(0.3, 2000)
    assert lo < 600 < hi
    assert binomial_interval(0.0, 10) == (0, 0)
    assert binomial_interval(1.0, 10) == (10, 10)


async def test_http_cut_decisions_match_the_generator(client: httpx.AsyncClient) -> None:
    """A sample through HTTP cuts exactly where the in-process simulation of the same request does."""
    for i in range(60):
        body = chat_body("sim-verbose", ARITH, 40 + i)
        reply = (await client.post("/v1/chat/completions", json=body, headers={"x-sim-seed": str(i)})).json()
        gen = simulate(7, "chat", body, sim_seed=str(i))
        assert (reply["choices"][0]["finish_reason"] == "length") == gen.cut
        assert reply["usage"]["completion_tokens"] == gen.output_tokens
