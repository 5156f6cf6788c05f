"""Every reply shape of the four wire formats parses in the official SDKs, streamed and not.

The openai and anthropic clients run with strict response validation over an in-process
ASGI transport; google-genai talks to a `SimServer` on loopback. The shapes swept: whole
calls, calls cut at every token of the turn (mid-text, mid-key, mid-string, mid-number,
after the last brace), parallel calls, final answers, leaks, malformed arguments.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from google import genai
from google.genai import types as gtypes
from starlette.applications import Starlette

from collector.sim.server import SimServer
from tests.sim.conftest import APPROVAL, ARITH, LOOKUP, REFUND, TOOL_NAMES, chat_tools

# (model, prompt, caps): caps 1..40 on the approval turn walk the cut through every position.
CASES: list[tuple[str, str, int]] = (
    [("sim-perfect", APPROVAL, cap) for cap in range(1, 44)]
    + [("sim-terse", p, cap) for p in (ARITH, REFUND, LOOKUP) for cap in (4, 16, 300)]
    + [("sim-leaky", REFUND, cap) for cap in (8, 20, 40, 300)]
    + [("sim-sloppy", ARITH, cap) for cap in (16, 300)]
    + [("sim-hidden-cut", ARITH, cap) for cap in (12, 30)]
)
SEEDS = ("0", "1", "2")


@pytest.fixture
async def oai(app: Starlette) -> AsyncIterator[openai.AsyncOpenAI]:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app))
    client = openai.AsyncOpenAI(api_key="sk-sim", base_url="http://sim/v1", http_client=http, max_retries=0,
                                _strict_response_validation=True)
    yield client
    await client.close()


@pytest.fixture
async def claude(app: Starlette) -> AsyncIterator[anthropic.AsyncAnthropic]:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app))
    client = anthropic.AsyncAnthropic(api_key="sk-sim", base_url="http://sim", http_client=http,
                                      max_retries=0,
                                      _strict_response_validation=True)
    yield client
    await client.close()


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    with SimServer(seed=7) as srv:
        yield srv


async def test_chat_shapes_parse(oai: openai.AsyncOpenAI) -> None:
    """Chat Completions replies and streams of every case parse in the openai SDK."""
    for model, prompt, cap in CASES:
        for seed in SEEDS:
            kwargs: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt}],
                                      "tools": chat_tools(), "max_completion_tokens": cap,
                                      "extra_headers": {"x-sim-seed": seed}}
            whole = await oai.chat.completions.create(**kwargs)
            assert whole.usage is not None
            cut = whole.usage.completion_tokens == cap
            reason = whole.choices[0].finish_reason
            if model == "sim-hidden-cut" and cut and whole.choices[0].message.tool_calls:
                assert reason == "tool_calls"
            else:
                assert cut == (reason == "length")
            async with await oai.chat.completions.create(
                    **kwargs, stream=True, stream_options={"include_usage": True}) as stream:
                chunks = [c async for c in stream]
            assert chunks[-1].usage is not None
            assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


async def test_responses_shapes_parse(oai: openai.AsyncOpenAI) -> None:
    """Responses replies and event streams of every case parse in the openai SDK, status matching the cut."""
    tools: list[Any] = [{"type": "function", "name": n, "parameters": {"type": "object", "properties": {}},
                         "strict": False} for n in TOOL_NAMES]
    for model, prompt, cap in CASES:
        for seed in SEEDS[:2]:
            kwargs: dict[str, Any] = {"model": model, "input": prompt, "tools": tools,
                                      "max_output_tokens": cap, "extra_headers": {"x-sim-seed": seed}}
            whole = await oai.responses.create(**kwargs)
            assert whole.usage is not None
            assert (whole.status == "incomplete") == (whole.usage.output_tokens == cap)
            if whole.status == "incomplete":
                assert whole.incomplete_details is not None
                assert whole.incomplete_details.reason == "max_output_tokens"
            events = [e async for e in await oai.responses.create(**kwargs, stream=True)]
            assert events[-1].type == f"response.{whole.status}"
            assert [e.sequence_number for e in events] == list(range(len(events)))
            final = events[-1].response  # type: ignore[union-attr]
            assert final.model_dump() == whole.model_dump()


async def test_anthropic_shapes_parse(claude: anthropic.AsyncAnthropic) -> None:
    """Messages replies and streams of every case parse in the anthropic SDK and accumulate alike."""
    tools: list[Any] = [{"name": n, "input_schema": {"type": "object", "properties": {}}} for n in TOOL_NAMES]
    for model, prompt, cap in CASES:
        for seed in SEEDS[:2]:
            kwargs: dict[str, Any] = {"model": model, "max_tokens": cap, "tools": tools,
                                      "messages": [{"role": "user", "content": prompt}],
                                      "extra_headers": {"x-sim-seed": seed}}
            whole = await claude.messages.create(**kwargs)
            assert (whole.stop_reason == "max_tokens") == (whole.usage.output_tokens == cap)
            async with claude.messages.stream(**kwargs) as stream:
                final = await stream.get_final_message()
            assert final.stop_reason == whole.stop_reason
            assert final.usage.output_tokens == whole.usage.output_tokens
            assert [b.type for b in final.content] == [b.type for b in whole.content]
            if whole.stop_reason != "max_tokens":
                assert final.model_dump() == whole.model_dump()


def test_gemini_shapes_parse(server: SimServer) -> None:
    """generateContent replies and SSE streams of every case parse in google-genai."""
    client = genai.Client(api_key="sim-key",
                          http_options=gtypes.HttpOptions(base_url=server.base_url, api_version="v1beta"))
    decls = [gtypes.FunctionDeclaration(name=n, description=n, parameters_json_schema={"type": "object"})
             for n in TOOL_NAMES]
    for model, prompt, cap in CASES[::3] + CASES[-10:]:
        config = gtypes.GenerateContentConfig(
            max_output_tokens=cap, tools=[gtypes.Tool(function_declarations=decls)],
            automatic_function_calling=gtypes.AutomaticFunctionCallingConfig(disable=True))
        whole = client.models.generate_content(model=model, contents=prompt, config=config)
        candidate = whole.candidates[0]  # type: ignore[index]
        assert whole.usage_metadata is not None
        cut = candidate.finish_reason == gtypes.FinishReason.MAX_TOKENS
        assert cut == (whole.usage_metadata.candidates_token_count == cap)
        chunks = list(client.models.generate_content_stream(model=model, contents=prompt, config=config))
        assert chunks[-1].candidates[0].finish_reason == candidate.finish_reason  # type: ignore[index]
        streamed_calls = [p.function_call for c in chunks for p in (c.candidates[0].content.parts or [])  # type: ignore[index,union-attr]
                          if p.function_call]
        whole_calls = [p.function_call for p in (candidate.content.parts or []) if p.function_call]  # type: ignore[union-attr]
        assert streamed_calls == whole_calls
    client.close()


async def test_anthropic_cut_input_drops_unfinished_values(claude: anthropic.AsyncAnthropic) -> None:
    """A cut tool_use's input holds only finished members: 1000 cut after 10 is absent, never 10."""
    tools: list[Any] = [{"name": "refund", "input_schema": {"type": "object"}}]
    seen_amount = seen_partial = False
    for cap in range(1, 30):
        reply = await claude.messages.create(model="sim-perfect", max_tokens=cap, tools=tools,
                                             messages=[{"role": "user", "content": REFUND}])
        for block in reply.content:
            if block.type == "tool_use":
                assert block.input.get("amount", 1000) == 1000  # type: ignore[union-attr]
                assert block.input.get("order_id", "A-1001") == "A-1001"  # type: ignore[union-attr]
                seen_amount |= "amount" in block.input  # type: ignore[operator]
                seen_partial |= reply.stop_reason == "max_tokens" and "order_id" in block.input  # type: ignore[operator]
    assert seen_amount
    assert seen_partial


async def test_leaky_preset_shows_each_family(oai: openai.AsyncOpenAI) -> None:
    """sim-leaky shows the trailing, wrapped, concatenated and Hermes-in-content leaks."""
    seen: set[str] = set()
    for i in range(120):
        reply = await oai.chat.completions.create(
            model="sim-leaky", messages=[{"role": "user", "content": REFUND}], tools=chat_tools(),
            max_completion_tokens=40, extra_headers={"x-sim-seed": str(i)})
        message = reply.choices[0].message
        if message.tool_calls == [] and "<tool_call>" in (message.content or ""):
            assert reply.choices[0].finish_reason == "length"
            seen.add("hermes_content")
        for call in message.tool_calls or []:
            args = call.function.arguments  # type: ignore[union-attr]
            if args.startswith("<tool_call>"):
                seen.add("wrapped")
            elif args.endswith("<tool_call|>"):
                seen.add("trailing")
            elif '<tool_call|>{"name"' in args:
                seen.add("concatenated")
    assert seen == {"trailing", "wrapped", "concatenated", "hermes_content"}


async def test_sloppy_preset_sends_invalid_json_of_the_same_length(oai: openai.AsyncOpenAI) -> None:
    """sim-sloppy's malformed arguments are not JSON, and have the length of the intended arguments."""
    bad = 0
    for i in range(60):
        reply = await oai.chat.completions.create(
            model="sim-sloppy", messages=[{"role": "user", "content": REFUND}], tools=chat_tools(),
            max_completion_tokens=400, extra_headers={"x-sim-seed": str(i)})
        args = reply.choices[0].message.tool_calls[0].function.arguments  # type: ignore[index,union-attr]
        try:
            json.loads(args)
        except ValueError:
            bad += 1
            assert len(args) == len('{"order_id": "A-1001", "amount": 1000}')
    assert 0 < bad < 60
