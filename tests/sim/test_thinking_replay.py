"""The simulator checks replayed reasoning as strictly as the real APIs, in each dialect's shape,
and answers an over-long prompt with each dialect's context-length error."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
import pytest

from collector.errors import ContextOverflow
from collector.providers.http import classify_error_body
from collector.sim.app import create_app
from collector.sim.presets import PRESETS
from collector.sim.thinking import call_signature, sign

_PRESETS = {**PRESETS, "tiny": dataclasses.replace(PRESETS["sim-perfect"], name="tiny", context_window=5)}
ARGS = {"expression": "37 * 12 + 5"}
PROMPT = "What is 37 * 12 + 5? Use the calculator tool, then reply with the number only."


def _anthropic(model: str, thinking: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    return "/v1/messages", {
        "model": model,
        "max_tokens": 256,
        "messages": [
            {"role": "user", "content": PROMPT},
            {
                "role": "assistant",
                "content": [
                    *thinking,
                    {"type": "tool_use", "id": "toolu_1", "name": "calculator", "input": ARGS},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "449"}],
            },
        ],
    }


def _responses(model: str, reasoning: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    return "/v1/responses", {
        "model": model,
        "input": [
            {"role": "user", "content": PROMPT},
            *reasoning,
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "calculator",
                "arguments": '{"expression": "37 * 12 + 5"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "449"},
        ],
    }


def _gemini(model: str, signature: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return f"/v1beta/models/{model}:generateContent", {
        "contents": [
            {"role": "user", "parts": [{"text": PROMPT}]},
            {"role": "model", "parts": [{"functionCall": {"name": "calculator", "args": ARGS}, **signature}]},
            {
                "role": "user",
                "parts": [{"functionResponse": {"name": "calculator", "response": {"output": "449"}}}],
            },
        ]
    }


THOUGHT = "let me add it up"
CASES = {
    "anthropic-missing": (_anthropic("sim-thinker", []), "Expected `thinking` or `redacted_thinking`"),
    "anthropic-altered": (
        _anthropic(
            "sim-thinker",
            [{"type": "thinking", "thinking": THOUGHT + "!", "signature": sign("anthropic", THOUGHT)}],
        ),
        "Invalid `signature`",
    ),
    "responses-missing": (_responses("sim-thinker", []), "without its required 'reasoning' item"),
    "responses-altered": (
        _responses(
            "sim-thinker", [{"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "sig_x"}]
        ),
        "could not be verified",
    ),
    "gemini-missing": (_gemini("sim-thinker", {}), "missing a thought_signature"),
    "gemini-altered": (_gemini("sim-thinker", {"thoughtSignature": "sig_x"}), "Corrupted thought signature"),
}
INTACT = {
    "anthropic": _anthropic(
        "sim-thinker", [{"type": "thinking", "thinking": THOUGHT, "signature": sign("anthropic", THOUGHT)}]
    ),
    "responses": _responses(
        "sim-thinker",
        [
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "encrypted_content": sign("responses", "rs_1", ""),
            }
        ],
    ),
    "gemini": _gemini("sim-thinker", {"thoughtSignature": call_signature("calculator", ARGS)}),
    "anthropic-no-thinking-model": _anthropic("sim-perfect", []),
    "responses-no-thinking-model": _responses("sim-perfect", []),
    "gemini-no-thinking-model": _gemini("sim-perfect", {}),
}


async def _post(path: str, body: dict[str, Any]) -> httpx.Response:
    transport = httpx.ASGITransport(app=create_app(seed=0, presets=_PRESETS))
    async with httpx.AsyncClient(transport=transport, base_url="http://sim.test") as client:
        return await client.post(path, json=body)


@pytest.mark.parametrize("case", list(CASES))
async def test_a_broken_reasoning_replay_is_a_400_in_the_dialects_shape(case: str) -> None:
    """A missing or altered signature / reasoning item is a 400 worded and shaped as the dialect's API."""
    (path, body), words = CASES[case]
    reply = await _post(path, body)
    assert reply.status_code == 400
    payload = reply.json()
    if case.startswith("anthropic"):
        assert payload["type"] == "error"
        assert payload["error"]["type"] == "invalid_request_error"
    elif case.startswith("gemini"):
        assert payload["error"]["status"] == "INVALID_ARGUMENT"
    else:
        assert payload["error"]["type"] == "invalid_request_error"
    assert words in payload["error"]["message"]


@pytest.mark.parametrize("case", list(INTACT))
async def test_an_intact_replay_or_a_model_that_does_not_think_is_accepted(case: str) -> None:
    """The items the simulator issued, sent back unchanged, pass; a model that never thinks
    requires none."""
    path, body = INTACT[case]
    reply = await _post(path, body)
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize(
    ("kind", "path", "body"),
    [
        (
            "chat",
            "/v1/chat/completions",
            {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}]},
        ),
        ("responses", "/v1/responses", {"model": "tiny", "input": PROMPT}),
        (
            "anthropic",
            "/v1/messages",
            {"model": "tiny", "max_tokens": 64, "messages": [{"role": "user", "content": PROMPT}]},
        ),
        (
            "gemini",
            "/v1beta/models/tiny:generateContent",
            {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]},
        ),
    ],
)
async def test_an_over_long_prompt_gets_the_dialects_context_error(
    kind: str, path: str, body: dict[str, Any]
) -> None:
    """Past the preset's context window each dialect answers its own context-length error,
    which the collector's classifier reads as `ContextOverflow`."""
    reply = await _post(path, body)
    assert reply.status_code == 400
    assert isinstance(classify_error_body(reply.json(), 400, None, kind), ContextOverflow)
