"""A small run with everything the report draws: two models x three budgets, cut, malformed,
error and done episodes, retries, captured tokens (one turn discarded), a reasoning sweep with
thinking cuts, and model output that tries to run a script (`HOSTILE`).

Built in-process from `tests.record.factory` and committed through the real `LocalRunStore`, so
every reader sees what a collector run leaves (no Ray, under a second).
"""

from __future__ import annotations

from pathlib import Path

from collector.record.chat import chat_messages
from collector.record.episode import Episode
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from tests.record.factory import make_episode

S = StopReason
BUDGETS = (64, 128, 256)
MODELS = ("sim-alpha", "sim-think")
#: Model output that would run (and call out) if the page did not escape it.
HOSTILE = ('<script>window.__pwned = 1</script><img src="http://127.0.0.1:9/x.png" '
           'onerror="window.__pwned = 2">')


def _mix(budget: int) -> tuple[StopReason, ...]:
    # Truncation falls with the budget; 128 has an error and a malformed episode.
    if budget == 64:
        return (S.LENGTH, S.LENGTH, S.DONE, S.MALFORMED_TOOL_CALL)
    if budget == 128:
        return (S.LENGTH, S.DONE, S.ERROR, S.DONE, S.MALFORMED_TOOL_CALL, S.DONE)
    return (S.DONE,)


def _decorate(ep: Episode, i: int) -> Episode:
    """Tokens on every turn, a retry now and then, a thinking cut and the hostile text."""
    for t in ep.turns:
        n = min(t.output_tokens, 40)
        t.tokens_requested = True
        t.output_token_ids = [1000 + 7 * k + t.index for k in range(n)]
        t.output_logprobs = [-0.05 * (k % 9) for k in range(n)]
        t.prompt_token_ids = list(range(20))
        t.prompt_ids_offset = 0
        t.token_counts_ok = None
    if i % 5 == 1:
        ep.turns[0].retries = ["429"]
        ep.retries = ["429"]
    if i % 7 == 3:
        ep.turns[0].retries = ["5xx", "timeout"]
        ep.retries = ["5xx", "timeout"]
    if ep.model == "sim-think":
        ep.reasoning = "effort=low" if i % 2 else "effort=high"
        last = ep.turns[-1]
        if last.finish_class == "length" and i % 2:
            last.length_signals = ["finish_reason", "reasoning"]
            last.reasoning_text = "Let me think about the refund step by step <b>first</b>"
            last.reasoning_tokens = last.output_tokens
    else:
        ep.reasoning = "none"
    if ep.stop_reason is S.LENGTH and i == 0:
        ep.messages[1].text = "Please answer. " + HOSTILE
    ep.chat = chat_messages(ep.messages)  # as the episode loop fills it
    return ep


def build_run(path: Path) -> Path:
    """The run directory at `path` (created)."""
    with LocalRunStore.open(path, "fp-report-test", {"name": "report-test"}, "arrow", 16) as store:
        for model in MODELS:
            for budget in BUDGETS:
                stops = _mix(budget)
                episodes = [_decorate(make_episode(stops[i % len(stops)], model=model, budget=budget,
                                                   task=f"t{i}"), i) for i in range(24)]
                store.commit(episodes)
    return path
