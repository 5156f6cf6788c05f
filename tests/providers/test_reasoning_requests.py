"""Reasoning settings reach each wire in its own words, and reasoning replies are read on each."""

from __future__ import annotations

from collector.providers.anthropic import build_anthropic_body
from collector.providers.chat import build_chat_body
from collector.providers.gemini import build_gemini_body
from collector.providers.responses import build_responses_body
from collector.turn import SamplingParams, TurnRequest, UserMessage


def _request(**params: object) -> TurnRequest:
    return TurnRequest("m", [UserMessage("hi")], [], 4096, SamplingParams(**params))  # type: ignore[arg-type]


def test_effort_and_budget_are_mapped_per_wire() -> None:
    """`reasoning_effort` / `thinking_budget` become each API's own request fields."""
    effort = _request(reasoning_effort="low")
    budget = _request(thinking_budget=2048)
    assert build_chat_body(effort, "max_completion_tokens", False)["reasoning_effort"] == "low"
    body = build_responses_body(effort, False)
    assert body["reasoning"]["effort"] == "low"
    assert "reasoning.encrypted_content" in body["include"]  # stateless: the items must come back
    assert build_anthropic_body(budget, False)["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert build_gemini_body(budget)["generationConfig"]["thinkingConfig"] == {
        "includeThoughts": True,
        "thinkingBudget": 2048,
    }
    both = build_gemini_body(_request(reasoning_effort="low", thinking_budget=512))
    assert both["generationConfig"]["thinkingConfig"] == {"includeThoughts": True, "thinkingBudget": 512}
    assert build_gemini_body(effort)["generationConfig"]["thinkingConfig"]["thinkingLevel"] == "low"
    plain = _request()
    assert "reasoning_effort" not in build_chat_body(plain, "max_completion_tokens", False)
    assert "reasoning" not in build_responses_body(plain, False)
    assert "thinking" not in build_anthropic_body(plain, False)
    assert "thinkingConfig" not in build_gemini_body(plain)["generationConfig"]
