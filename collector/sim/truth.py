"""Ground truth: how often a simulated model's turn is cut at a given output budget.

Exact, not estimated. A turn needs ``L + F`` tokens, where ``L`` is the preset's preamble
length (a tabulated discrete distribution, `collector.sim.presets.LengthDist`) and ``F`` is
fixed by the task: the call(s) serialized in the preset's argument style plus template
tokens, or the answer text (`collector.sim.tokenizer`). The turn is cut exactly when
``L + F >= budget`` (the end-of-turn token must fit too), so

    P(cut) = P(L >= budget - F),

read off the same table the generator samples from. Faults do not move it: leaks, wrong and
malformed arguments are length-preserving, and transient errors are not turns.

`F` depends on the task. The defaults are the reference tasks: the call step is
``calculator(expression="37 * 12 + 5")`` and the answer step is ``"449"``; pass
`fixed_tokens` (see `call_tokens_for` / `answer_tokens_for`) for any other task. For a turn
of any plan, the built-in tasks' or the explorer's (`collector.sim.explore`, which plays the
tools of a prompt no template matches, with arguments fixed by the schema and the prompt),
`plan_fixed_tokens(model, policy.decide(history, tools, schemas))` is its `F`.

`monte_carlo_cut_rate` runs the simulator's own generator, and `binomial_interval` gives the
acceptance band tests hold a measured rate against.
"""

from __future__ import annotations

import math
import random
from typing import Any, Literal

from collector.sim.generate import generate, serialize
from collector.sim.policy import Plan, PlannedCall
from collector.sim.presets import PRESETS, ModelPreset
from collector.sim.tokenizer import CALL_HEAD_TOKENS, call_tokens, count_tokens

Step = Literal["call", "answer"]

REFERENCE_CALL = PlannedCall("calculator", (("expression", "37 * 12 + 5"),))
REFERENCE_ANSWER = "449"


def _preset(model: str) -> ModelPreset:
    try:
        return PRESETS[model]
    except KeyError:
        raise KeyError(f"unknown simulated model {model!r}; known: {sorted(PRESETS)}") from None


def call_tokens_for(model: str, calls: list[tuple[str, dict[str, Any]]]) -> int:
    """Fixed tokens of a call turn making `calls` (name, arguments in order) with `model`'s style."""
    style = _preset(model).arg_style
    return sum(call_tokens(serialize(tuple(args.items()), style)[0]) for _, args in calls)


def answer_tokens_for(answer: str) -> int:
    """Fixed tokens of a final answer whose text (after the preamble) is `answer`."""
    return count_tokens(answer)


def plan_fixed_tokens(model: str, plan: Plan) -> int:
    """`F` of the turn `plan` asks for: its calls in `model`'s argument style, or its answer.
    Pass it as `fixed_tokens` with step "call" when `plan.calls`, else "answer"."""
    if plan.calls:
        return call_tokens_for(model, [(c.name, dict(c.arguments)) for c in plan.calls])
    return answer_tokens_for(plan.answer)


def _fixed(model: str, step: Step) -> int:
    if step == "call":
        return call_tokens_for(model, [(REFERENCE_CALL.name, dict(REFERENCE_CALL.arguments))])
    return answer_tokens_for(REFERENCE_ANSWER)


def turn_cut_probability(model: str, budget: int, step: Step, fixed_tokens: int | None = None) -> float:
    """Probability that one turn of `model` is cut at output cap `budget`.

    `step` "call": a turn making the reference call (or calls of `fixed_tokens` tokens);
    "answer": a final answer (reference "449", or `fixed_tokens`).
    """
    preset = _preset(model)
    dist = preset.preamble if step == "call" else preset.answer_preamble
    fixed = _fixed(model, step) if fixed_tokens is None else fixed_tokens
    if preset.thinking is None:
        return dist.survival(budget - fixed)
    # A thinking turn needs T + L + F tokens, T (at least 1) drawn independently of L.
    return sum(p * dist.survival(budget - fixed - t) for t, p in _thinking_pmf(preset))


def _thinking_pmf(preset: ModelPreset, thinking_budget: int | None = None) -> list[tuple[int, float]]:
    """P(T == t) of the thought length as the generator draws it (a 0 draw thinks 1 token;
    a request's thinking budget caps it)."""
    assert preset.thinking is not None
    pmf = list(preset.thinking.pmf())
    if len(pmf) > 1:
        pmf[1] += pmf[0]
        pmf[0] = 0.0
    if thinking_budget is not None and thinking_budget < len(pmf) - 1:
        pmf[thinking_budget] += sum(pmf[thinking_budget + 1:])
        del pmf[thinking_budget + 1:]
    return [(t, p) for t, p in enumerate(pmf) if p > 0.0]


def thinking_fills_cap_probability(model: str, budget: int, thinking_budget: int | None = None) -> float:
    """Probability that the thought alone reaches the cap `budget` (reasoning tokens == cap):
    the part of the thinking-cut rate that is the same on every wire and for every task."""
    preset = _preset(model)
    if preset.thinking is None:
        return 0.0
    return sum(p for t, p in _thinking_pmf(preset, thinking_budget) if t >= budget)


def thinking_cut_probability(
    model: str, budget: int, step: Step, thinking_budget: int | None = None
) -> float:
    """Probability that one turn of `model` spends the cap `budget` on thinking: cut with no
    visible text and no call (0 for a model that does not think), with the request's
    `thinking_budget` if any. It does not depend on the task's call or answer. "No call" as a
    wire that shows a cut call (Chat, Responses, Anthropic); Gemini drops an unclosed call, so
    there a cut inside the call after a thought and no preamble shows nothing either."""
    preset = _preset(model)
    if preset.thinking is None:
        return 0.0
    total = 0.0
    for t, p in _thinking_pmf(preset, thinking_budget):
        if t >= budget:
            total += p  # the thought itself reached the cap
        elif step == "call" and budget - t < CALL_HEAD_TOKENS:
            total += p * preset.preamble.pmf()[0]  # no preamble and no room to open the call
    return total


def episode_truncation_probability(model: str, budget: int, calls: int, *, call_tokens: int | None = None,
                                   answer_tokens: int | None = None) -> float:
    """Probability that an episode of `calls` sequential call turns then one answer turn has
    at least one cut turn, with no other faults (turns draw their lengths independently).

    This counts every turn as if it ran: a collector that stops at the first cut turn
    truncates exactly these episodes, since the episode is truncated once any turn is.
    """
    p_call = turn_cut_probability(model, budget, "call", call_tokens)
    p_answer = turn_cut_probability(model, budget, "answer", answer_tokens)
    return 1.0 - (1.0 - p_call) ** calls * (1.0 - p_answer)


def monte_carlo_cut_rate(model: str, budget: int, step: Step, n: int, seed: int = 0) -> float:
    """The cut rate of `n` turns generated by the simulator itself (reference task)."""
    preset = _preset(model)
    plan = Plan(calls=(REFERENCE_CALL,)) if step == "call" else Plan(answer=REFERENCE_ANSWER)
    cuts = sum(generate(plan, preset, budget, random.Random(seed * 1_000_003 + i)).cut for i in range(n))
    return cuts / n


def binomial_interval(p: float, n: int, confidence: float = 0.99) -> tuple[int, int]:
    """Central `confidence` interval of Binomial(n, p), in counts: ``(lo, hi)`` inclusive.

    Exact (summed PMF), with at most ``(1 - confidence) / 2`` of the mass below `lo` and above `hi`.
    """
    if p <= 0.0:
        return 0, 0
    if p >= 1.0:
        return n, n
    tail = (1.0 - confidence) / 2.0
    log_p, log_q = math.log(p), math.log1p(-p)
    log_n = math.lgamma(n + 1)
    pmf = [math.exp(log_n - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q)
           for k in range(n + 1)]
    lo, acc = 0, 0.0
    while lo < n and acc + pmf[lo] <= tail:
        acc += pmf[lo]
        lo += 1
    hi, acc = n, 0.0
    while hi > 0 and acc + pmf[hi] <= tail:
        acc += pmf[hi]
        hi -= 1
    return lo, hi
