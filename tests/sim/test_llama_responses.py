"""The simulator's llama-server Responses shapes (`responses_server="llamacpp"`, issue 31), and the
collector's Responses adapter against them, streamed and not."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from collector.providers.base import Endpoint
from collector.providers.responses import ResponsesProvider
from collector.sim.app import create_app
from collector.sim.presets import PRESETS
from collector.turn import (
    AssistantMessage,
    LengthSignal,
    ToolResultMessage,
    ToolSpec,
    TurnRequest,
    UserMessage,
)
from tests.sim.conftest import ARITH

LLAMA = replace(PRESETS["sim-perfect"], name="sim-llama-responses", responses_server="llamacpp")
TOOLS = [{"type": "function", "name": "calculator", "parameters": {"type": "object", "properties": {}}}]
SHORT = {"role": "assistant", "content": "Let me compute."}
EXPLICIT = {
    "type": "message",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "Let me compute."}],
}


@pytest.fixture
async def sim() -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(seed=7, presets={**PRESETS, LLAMA.name: LLAMA})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as c:
        yield c


def _body(model: str, assistant: dict[str, Any], cap: int = 256, **extra: Any) -> dict[str, Any]:
    user = {"role": "user", "content": ARITH}
    return {
        "model": model,
        "tools": TOOLS,
        "max_output_tokens": cap,
        "input": [user, assistant, {"role": "user", "content": ARITH}],
        **extra,
    }


@pytest.mark.parametrize("assistant", [SHORT, EXPLICIT], ids=["short", "explicit"])
async def test_openai_shape_accepts_both_assistant_forms(
    sim: httpx.AsyncClient, assistant: dict[str, Any]
) -> None:
    """The OpenAI-shaped simulator takes assistant text in the short and the explicit item form."""
    reply = await sim.post("/v1/responses", json=_body("sim-perfect", assistant))
    assert reply.status_code == 200, reply.text


async def test_llamacpp_shape_refuses_the_short_assistant_form(sim: httpx.AsyncClient) -> None:
    """llama-server's shape refuses the short assistant item with its 400 and takes the explicit one."""
    short = await sim.post("/v1/responses", json=_body(LLAMA.name, SHORT))
    assert short.status_code == 400
    assert "Cannot determine type of 'item'" in short.json()["error"]["message"]
    explicit = await sim.post("/v1/responses", json=_body(LLAMA.name, EXPLICIT))
    assert explicit.status_code == 200, explicit.text


async def test_llamacpp_stream_has_no_output_index_and_no_incomplete(sim: httpx.AsyncClient) -> None:
    """A cut streamed turn in llama-server's shape: no event has `output_index`, and it ends
    `response.completed` with `status: completed` (the cap shows only in the output count)."""
    body = {
        "model": LLAMA.name,
        "tools": TOOLS,
        "max_output_tokens": 5,
        "stream": True,
        "input": [{"role": "user", "content": ARITH}],
    }
    reply = await sim.post("/v1/responses", json=body)
    events = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: ")]
    assert events
    assert not any("output_index" in e for e in events)
    last = events[-1]
    assert last["type"] == "response.completed"
    assert last["response"]["status"] == "completed"
    assert last["response"]["usage"]["output_tokens"] == 5


CALCULATOR = ToolSpec(
    "calculator", "Evaluate.", {"type": "object", "properties": {"expression": {"type": "string"}}}
)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_adapter_over_llamacpp_shape(sim: httpx.AsyncClient, stream: bool) -> None:
    """The collector's Responses adapter against llama-server's shape: an uncut call turn is one
    call that may run, its history goes back accepted, and a cut is caught by `cap_reached` alone."""
    provider = ResponsesProvider(Endpoint("http://sim/v1", streaming=stream), sim)
    first = await provider.complete(
        TurnRequest(LLAMA.name, [UserMessage(ARITH)], [CALCULATOR], max_output_tokens=256)
    )
    assert first.length_signals == ()
    (call,) = first.tool_calls
    history = [
        UserMessage(ARITH),
        AssistantMessage("Let me compute.", [call]),
        ToolResultMessage(call.id, call.name, "449"),
    ]
    second = await provider.complete(TurnRequest(LLAMA.name, history, [CALCULATOR], max_output_tokens=256))
    assert second.text == "449"
    cut = await provider.complete(
        TurnRequest(LLAMA.name, [UserMessage(ARITH)], [CALCULATOR], max_output_tokens=5)
    )
    assert cut.raw_finish_reason == "completed"
    assert cut.length_signals == (LengthSignal.CAP_REACHED,)
