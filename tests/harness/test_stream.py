"""Streamed replies through the gateway: the text as the model writes it, calls once the turn is classified.

The upstream is a Chat Completions server held in this process (an httpx transport whose
stream waits on an event): it sends its first text, then holds the rest of the turn until
the harness has seen that text. The gateway runs on a loopback socket in the same event loop
(`GatewayServer`), and the harness is each wire's official SDK client, streaming.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from anthropic import AsyncAnthropic
from openai import APIError, AsyncOpenAI

from collector.config import LoopConfig
from collector.episode.loop import EpisodeSpec
from collector.errors import ProviderUnavailable
from collector.harness.gateway import Gateway, GatewayServer, episode_root
from collector.harness.session import HarnessSession
from collector.harness.stream import TurnRelay
from collector.providers import build_provider
from collector.providers.base import Endpoint, RetryPolicy
from collector.providers.relay import current_relay
from collector.providers.scripted import ScriptedProvider, call, calls
from collector.stop import StopReason
from collector.turn import Turn, TurnRequest
from tests.harness.helpers import CALCULATOR_PARAMETERS, TASKS

#: A bound on a wait that only a broken gateway makes long (it would never end otherwise).
HANG_GUARD_S = 30
FIRST_TEXT, REST_TEXT = "Let me ", "compute that."
THOUGHT = "12 times 7..."


class HeldUpstream(httpx.AsyncBaseTransport):
    """A streaming Chat Completions server whose turn waits, after its first text, for `release`.

    `cut`: the call is cut at the cap (`finish_reason: "length"`, arguments unfinished), else
    it is whole (`tool_calls`)."""

    def __init__(self, cut: bool) -> None:
        self.cut = cut
        self.release = asyncio.Event()
        self.finished = False
        self.streamed: list[bool] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(await request.aread())
        self.streamed.append(bool(body.get("stream")))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Chunks(self))

    async def chunks(self) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            data = {"id": "up-1", "object": "chat.completion.chunk", "model": "m", "choices": [choice],
                    **extra}
            return b"data: " + json.dumps(data).encode() + b"\n\n"

        yield chunk({"role": "assistant", "reasoning_content": THOUGHT})
        yield chunk({"content": FIRST_TEXT})
        await self.release.wait()  # the rest of the turn only once the harness saw its first text
        yield chunk({"content": REST_TEXT})
        opened = {"index": 0, "id": "call_1", "type": "function",
                  "function": {"name": "calculator", "arguments": '{"expression": '}}
        yield chunk({"tool_calls": [opened]})
        rest = '"12*' if self.cut else '"12*7"}'
        yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": rest}}]})
        yield chunk({}, "length" if self.cut else "tool_calls")
        usage = {"prompt_tokens": 30, "completion_tokens": 64 if self.cut else 20, "total_tokens": 94}
        yield b"data: " + json.dumps({"id": "up-1", "choices": [], "usage": usage}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
        self.finished = True


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, upstream: HeldUpstream) -> None:
        self.upstream = upstream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self.upstream.chunks():
            yield part


#: A harness: (its episode's root URL, token, the upstream to release) -> what it saw.
Harness = Callable[[str, str, HeldUpstream], Awaitable["Seen"]]


class Seen:
    """What a streaming harness received, in order."""

    def __init__(self) -> None:
        self.text = ""
        self.reasoning = ""
        self.text_before_upstream_finished = False
        self.call_events = 0
        """Events carrying any part of a tool call."""
        self.calls: list[tuple[str, Any]] = []
        """(name, parsed arguments) of the calls in the final message."""
        self.finish: str | None = None

    def saw_text(self, upstream: HeldUpstream, delta: str) -> None:
        if not self.text:
            self.text_before_upstream_finished = not upstream.finished
            upstream.release.set()
        self.text += delta


async def _chat(root: str, token: str, upstream: HeldUpstream) -> Seen:
    seen = Seen()
    async with AsyncOpenAI(base_url=root + "/v1", api_key=token, max_retries=0) as client:
        stream: Any = await client.chat.completions.create(
            model="anything", messages=[{"role": "user", "content": "12*7?"}], stream=True,
            tools=[{"type": "function",
                    "function": {"name": "calculator", "parameters": CALCULATOR_PARAMETERS}}],
        )
        calls: dict[int, list[str]] = {}
        async for chunk in stream:
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            seen.reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            if choice.delta.content:
                seen.saw_text(upstream, choice.delta.content)
            for call in choice.delta.tool_calls or ():
                seen.call_events += 1
                assert call.function is not None
                entry = calls.setdefault(call.index, [call.function.name or "", ""])
                entry[1] += call.function.arguments or ""
            seen.finish = choice.finish_reason or seen.finish
    seen.calls = [(name, json.loads(arguments)) for name, arguments in calls.values()]
    return seen


async def _responses(root: str, token: str, upstream: HeldUpstream) -> Seen:
    seen = Seen()
    async with AsyncOpenAI(base_url=root + "/v1", api_key=token, max_retries=0) as client:
        tool = {"type": "function", "name": "calculator", "parameters": CALCULATOR_PARAMETERS,
                "strict": False}
        final: Any = None
        async with client.responses.stream(model="anything", input="12*7?", tools=[tool]) as stream:  # type: ignore[list-item]
            event: Any
            async for event in stream:
                if event.type in ("response.completed", "response.incomplete"):
                    final = event.response  # the SDK's `get_final_response` wants `completed` only
                elif event.type == "response.output_text.delta":
                    seen.saw_text(upstream, event.delta)
                elif event.type == "response.reasoning_summary_text.delta":
                    seen.reasoning += event.delta
                elif "function_call" in event.type or (
                        event.type.startswith("response.output_item") and event.item.type == "function_call"):
                    seen.call_events += 1
    assert final is not None
    seen.finish = final.status
    seen.calls = [(item.name, json.loads(item.arguments))
                  for item in final.output if item.type == "function_call"]
    assert final.output_text == seen.text
    return seen


async def _messages(root: str, token: str, upstream: HeldUpstream) -> Seen:
    seen = Seen()
    async with AsyncAnthropic(base_url=root, api_key=token, max_retries=0) as client:
        tool = {"name": "calculator", "input_schema": CALCULATOR_PARAMETERS}
        async with client.messages.stream(model="anything", max_tokens=5000, tools=[tool],  # type: ignore[list-item]
                                          messages=[{"role": "user", "content": "12*7?"}]) as stream:
            async for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    seen.saw_text(upstream, event.delta.text)
                elif event.type == "content_block_delta" and event.delta.type == "thinking_delta":
                    seen.reasoning += event.delta.thinking
                elif (event.type == "content_block_delta" and event.delta.type == "input_json_delta") or (
                        event.type == "content_block_start" and event.content_block.type == "tool_use"):
                    seen.call_events += 1
            final = await stream.get_final_message()
    seen.finish = final.stop_reason
    seen.calls = [(block.name, block.input) for block in final.content if block.type == "tool_use"]
    return seen


HARNESSES = {"chat": _chat, "responses": _responses, "messages": _messages}
#: Each wire's finish for an allowed call turn, and its truncation signal for a withheld one.
FINISH = {"chat": ("tool_calls", "length"), "responses": ("completed", "incomplete"),
          "messages": ("tool_use", "max_tokens")}


async def _through_gateway(harness: Harness, cut: bool) -> tuple[Seen, HeldUpstream, HarnessSession]:
    upstream = HeldUpstream(cut)
    gateway = Gateway()
    server = GatewayServer(gateway)
    await server.start()
    try:
        async with httpx.AsyncClient(transport=upstream) as client:
            # The run's endpoint does not stream: the gateway reads the upstream as a stream anyway.
            endpoint = Endpoint("http://up/v1", retry=RetryPolicy(max_retries=0))
            provider = build_provider("chat", endpoint, client)
            spec = EpisodeSpec(run_id="r", model="m", provider_kind="chat", budget=64, task=TASKS[0])
            session = HarnessSession(spec, provider, LoopConfig())
            gateway.open(session)
            async with asyncio.timeout(HANG_GUARD_S):
                seen = await harness(episode_root(server.root, session), session.token, upstream)
            gateway.close(session)
    finally:
        await server.stop()
    return seen, upstream, session


@pytest.mark.parametrize("wire", sorted(HARNESSES))
def test_text_reaches_the_harness_before_the_turn_ends_and_an_allowed_call_arrives_whole(wire: str) -> None:
    """A streaming harness reads the text while the turn is still being written, then gets the whole call."""
    seen, upstream, session = asyncio.run(_through_gateway(HARNESSES[wire], cut=False))
    assert upstream.streamed == [True]
    assert seen.text_before_upstream_finished  # the upstream held its turn until this text was seen
    assert seen.text == FIRST_TEXT + REST_TEXT
    assert seen.reasoning == THOUGHT
    assert seen.calls == [("calculator", {"expression": "12*7"})]
    assert seen.finish == FINISH[wire][0]
    assert session.reason is None
    assert session.state.turns[0].calls_withheld == 0


@pytest.mark.parametrize("wire", sorted(HARNESSES))
def test_a_cut_turn_streams_its_text_but_no_part_of_its_call(wire: str) -> None:
    """No tool-call delta of a turn cut at the cap reaches a streaming harness; its truncation signal does."""
    seen, _, session = asyncio.run(_through_gateway(HARNESSES[wire], cut=True))
    assert seen.text_before_upstream_finished
    assert seen.text == FIRST_TEXT + REST_TEXT
    assert seen.call_events == 0
    assert seen.calls == []
    assert seen.finish == FINISH[wire][1]
    assert session.reason is StopReason.LENGTH  # the episode ended there, as the loop's would
    assert session.state.turns[0].calls_withheld == 1


def test_a_retried_stream_passes_on_only_the_text_the_harness_has_not_had() -> None:
    """When the upstream stream fails midway and is retried whole, the harness gets no text twice."""
    async def go() -> list[object]:
        relay, first, retry = TurnRelay(), object(), object()
        relay.text(first, "Let me co")
        relay.text(retry, "Let ")  # the retry repeats what was sent: nothing new
        relay.text(retry, "me compute")
        relay.text(retry, " that.")
        out: list[object] = []
        while not relay.queue.empty():
            out.append(relay.queue.get_nowait())
        out.append(relay.rest_of_text("Let me compute that. Done"))
        return out

    assert asyncio.run(go()) == [("text", "Let me co"), ("text", "mpute"), ("text", " that."), " Done"]


def test_a_retry_whose_text_departs_from_what_was_sent_is_not_relayed() -> None:
    """A retry that writes other text than the harness already has is not spliced onto it."""
    relay, first, retry = TurnRelay(), object(), object()
    relay.text(first, "Let me")
    relay.text(retry, "Sure, ")
    relay.text(retry, "the answer")
    assert relay.queue.qsize() == 1
    assert relay.rest_of_text("Sure, the answer") == ""


class _TextThenFailure:
    """An adapter that streams some text, then fails for good (its retries spent)."""

    kind = "chat"

    async def complete(self, request: TurnRequest) -> Turn:
        relay = current_relay()
        assert relay is not None
        relay.text(self, FIRST_TEXT)
        raise ProviderUnavailable("chat: stream ended without [DONE]")


async def _chat_over_asgi(app: Any, root: str, token: str) -> Seen:
    seen = Seen()
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app))
    async with AsyncOpenAI(base_url=root + "/v1", api_key=token, http_client=http, max_retries=0) as client:
        stream: Any = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "12*7?"}], stream=True)
        try:
            async for chunk in stream:
                if chunk.choices:
                    seen.text += chunk.choices[0].delta.content or ""
                    seen.call_events += len(chunk.choices[0].delta.tool_calls or ())
                    seen.finish = chunk.choices[0].finish_reason or seen.finish
        except APIError as exc:
            seen.finish = f"error: {exc.message}"
    return seen


async def _one_turn(provider: Any) -> tuple[Seen, HarnessSession]:
    """One streamed Chat turn through the gateway's app (in process: the reply arrives whole)."""
    gateway = Gateway()
    spec = EpisodeSpec(run_id="r", model="m", provider_kind="chat", budget=64, task=TASKS[0])
    session = HarnessSession(spec, provider, LoopConfig())
    gateway.open(session)
    return await _chat_over_asgi(gateway.app, episode_root("http://gateway", session), session.token), session


def test_an_upstream_that_does_not_stream_gives_its_text_in_one_delta_then_its_calls() -> None:
    """With an adapter that returns whole turns, the streamed reply still carries the text, then the calls."""
    provider = ScriptedProvider([calls(call("calculator", {"expression": "12*7"}), text="Computing.",
                                       output_tokens=10)])
    seen, _ = asyncio.run(_one_turn(provider))
    assert (seen.text, seen.call_events, seen.finish) == ("Computing.", 1, "tool_calls")


def test_a_provider_failure_after_the_text_began_is_the_wires_error_event() -> None:
    """An upstream failing after some text ends the stream in an error the SDK raises; the episode ends."""
    seen, session = asyncio.run(_one_turn(_TextThenFailure()))
    assert seen.text == FIRST_TEXT
    assert seen.finish == "error: harness: the provider failed: ProviderUnavailable"
    assert session.reason is StopReason.ERROR
