"""Chat Completions: the policy's turns, cuts, streams and determinism, read by the openai SDK."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import httpx2
import openai
import pytest
from starlette.applications import Starlette

from tests.sim.conftest import ARITH, chat_body, chat_tools


@pytest.fixture
async def oai(app: Starlette) -> AsyncIterator[openai.AsyncOpenAI]:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app))
    client = openai.AsyncOpenAI(api_key="sk-sim", base_url="http://sim/v1", http_client=http, max_retries=0,
                                _strict_response_validation=True)
    yield client
    await client.close()


async def test_perfect_model_calls_calculator_then_answers(oai: openai.AsyncOpenAI) -> None:
    """sim-perfect calls calculator with the exact expression, then answers the tool's number."""
    first = await oai.chat.completions.create(
        model="sim-perfect", messages=[{"role": "user", "content": ARITH}], tools=chat_tools(),
        max_completion_tokens=256)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "calculator"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"expression": "37 * 12 + 5"}  # type: ignore[union-attr]
    assert first.usage is not None
    assert first.usage.completion_tokens < 256
    second = await oai.chat.completions.create(
        model="sim-perfect", tools=chat_tools(), max_completion_tokens=256,
        messages=[{"role": "user", "content": ARITH},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": call.id, "type": "function",
                       "function": {"name": "calculator", "arguments": call.function.arguments}}]},  # type: ignore[union-attr]
                  {"role": "tool", "tool_call_id": call.id, "content": "449"}])
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "449"


async def test_cut_call_reports_length_and_cap(oai: openai.AsyncOpenAI) -> None:
    """A cap inside the call gives finish_reason length, completion_tokens == cap and cut arguments."""
    reply = await oai.chat.completions.create(
        model="sim-perfect", messages=[{"role": "user", "content": ARITH}], tools=chat_tools(),
        max_completion_tokens=6)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 6
    args = reply.choices[0].message.tool_calls[0].function.arguments  # type: ignore[index,union-attr]
    with pytest.raises(ValueError, match=r"Unterminated|Expecting|Extra"):
        json.loads(args)


async def test_cap_equal_to_turn_cuts_after_last_brace(client: httpx.AsyncClient) -> None:
    """A cap of exactly the turn's size leaves the arguments whole but the turn cut (no room for the stop)."""
    full = (await client.post("/v1/chat/completions", json=chat_body("sim-perfect", ARITH, 512))).json()
    need = full["usage"]["completion_tokens"]
    cut = (await client.post("/v1/chat/completions", json=chat_body("sim-perfect", ARITH, need))).json()
    assert cut["choices"][0]["finish_reason"] == "length"
    assert cut["usage"]["completion_tokens"] == need
    assert json.loads(cut["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == {
        "expression": "37 * 12 + 5"}
    roomy = (await client.post("/v1/chat/completions", json=chat_body("sim-perfect", ARITH, need + 1))).json()
    assert roomy["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("cap", [3, 5, 9, 12, 400])
async def test_stream_accumulates_to_the_non_stream_turn(oai: openai.AsyncOpenAI, cap: int) -> None:
    """Streamed and non-streamed replies to the same conversation carry the same turn."""
    kwargs = {"model": "sim-terse", "messages": [{"role": "user", "content": ARITH}], "tools": chat_tools(),
              "max_completion_tokens": cap}
    whole = await oai.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    text, args, reason, usage = "", "", None, None
    stream = await oai.chat.completions.create(**kwargs, stream=True,  # type: ignore[call-overload]
                                               stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                args += (tc.function.arguments or "") if tc.function else ""
            reason = choice.finish_reason or reason
    message = whole.choices[0].message
    assert text == (message.content or "")
    assert args == "".join(t.function.arguments for t in message.tool_calls or [])  # type: ignore[union-attr]
    assert reason == whole.choices[0].finish_reason
    assert usage is not None
    assert whole.usage is not None
    assert usage.completion_tokens == whole.usage.completion_tokens


async def test_same_request_gives_identical_bytes(client: httpx.AsyncClient) -> None:
    """Replaying an identical request returns a byte-identical reply, streamed or not."""
    for stream in (False, True):
        body = chat_body("sim-verbose", ARITH, 64, stream=stream)
        first = await client.post("/v1/chat/completions", json=body)
        second = await client.post("/v1/chat/completions", json=body)
        assert first.status_code == 200
        assert first.content == second.content


async def test_seed_changes_replies(client: httpx.AsyncClient) -> None:
    """Another server seed, or another x-sim-seed, gives another sample of the same prompt."""
    body = chat_body("sim-verbose", ARITH, 512)
    a = (await client.post("/v1/chat/completions", json=body)).json()
    b = (await client.post("/v1/chat/completions", json=body, headers={"x-sim-seed": "1"})).json()
    assert a["choices"][0]["message"]["content"] != b["choices"][0]["message"]["content"]


async def test_hidden_cut_reports_tool_calls_at_the_cap(client: httpx.AsyncClient) -> None:
    """sim-hidden-cut says finish_reason tool_calls for a call cut at the cap, as vLLM streaming does."""
    seen = 0
    for i in range(20):
        body = chat_body("sim-hidden-cut", ARITH, 24)
        reply = (await client.post("/v1/chat/completions", json=body, headers={"x-sim-seed": str(i)})).json()
        choice = reply["choices"][0]
        if choice["message"].get("tool_calls") and reply["usage"]["completion_tokens"] == 24:
            calls = choice["message"]["tool_calls"]
            assert choice["finish_reason"] == "tool_calls"
            if not calls[-1]["function"]["arguments"].endswith("}"):
                seen += 1
    assert seen > 0
