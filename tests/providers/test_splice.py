"""The history is encoded once per item and spliced, yet every request body is byte for byte
the fresh encoding of the same body, in every dialect, streaming or not."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from collector.providers.anthropic import build_anthropic_body
from collector.providers.chat import build_chat_body
from collector.providers.common import encode_body
from collector.providers.gemini import build_gemini_body
from collector.providers.responses import build_responses_body
from collector.providers.splice import encode_spliced
from collector.turn import (
    ArgStatus,
    AssistantMessage,
    JSONObject,
    Message,
    SamplingParams,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    TurnRequest,
    UserMessage,
)
from tests.providers.conftest import REFUND
from tests.providers.wirefab import KINDS, MODES, Fab, FabCall, build

Builder = Callable[[TurnRequest, bool], JSONObject]
BUILDERS: dict[str, tuple[Builder, str]] = {
    "chat": (lambda r, s: build_chat_body(r, "max_completion_tokens", s), "messages"),
    "responses": (build_responses_body, "input"),
    "anthropic": (build_anthropic_body, "messages"),
    "gemini": (lambda r, s: build_gemini_body(r), "contents"),
}


def _call(i: int, raw: str, status: ArgStatus = ArgStatus.OK) -> ToolCall:
    value = json.loads(raw) if status is not ArgStatus.MALFORMED else None
    return ToolCall(f"call_{i}", "refund", value, status, raw_arguments=raw, had_wire_id=i % 2 == 0)


def _growth() -> list[list[Message]]:
    """What an episode appends between its turns: calls, results (some adjacent), text, unicode."""
    return [
        [AssistantMessage("", [_call(0, '{"order_id":"A-1","amount":3}')]),
         ToolResultMessage("call_0", "refund", "refunded 3 € to «A-1»\n" + "x" * 300)],
        # Two results of one turn, then (next turn) a third result: Anthropic and Gemini merge
        # adjacent results into one wire message, which therefore changes between turns.
        [AssistantMessage("two at once",
                          [_call(1, '{"order_id":"B"}'), _call(2, "{bad", ArgStatus.MALFORMED)]),
         ToolResultMessage("call_1", "refund", "ok"),
         ToolResultMessage("call_2", "refund", "arguments did not parse", is_error=True)],
        [ToolResultMessage("call_2b", "refund", "a late result \u2603 😀")],
        [UserMessage("please continue: \"quoted\" \\ backslash \t tab")],
        [AssistantMessage("done: 日本語")],
    ]


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_spliced_body_is_the_fresh_encoding_every_turn(kind: str, stream: bool) -> None:
    """Turn after turn of a growing history, the spliced body equals encode_body of the same body."""
    builder, key = BUILDERS[kind]
    history: list[Message] = [SystemMessage("be brief"), UserMessage("refund A-1 ünïcode")]
    cache: dict[str, Any] = {}
    params = SamplingParams(temperature=0.5, tool_choice="auto", extra_body={"metadata": {"k": "v"}})
    reused = 0
    for i, added in enumerate([[], *_growth()]):
        history.extend(added)
        # The cap changes between some turns (an episode output budget): the rest of the body too.
        request = TurnRequest("m", history, [REFUND], 64 if i < 3 else 64 - i, params, cache)
        before = cache[key][1] if key in cache else []
        spliced = encode_spliced(builder(request, stream), key, cache)
        assert spliced == encode_body(builder(request, stream))
        reused += sum(old is new for old, new in zip(before, cache[key][1], strict=False))
    assert reused > 0, "no item was ever reused: the splice is not in effect"


@pytest.mark.parametrize("kind", KINDS)
def test_an_item_changed_in_place_is_encoded_again(kind: str) -> None:
    """A message edited after it was sent goes out as it is now, not as it was encoded."""
    builder, key = BUILDERS[kind]
    history: list[Message] = [UserMessage("first"), AssistantMessage("an answer")]
    cache: dict[str, Any] = {}
    encode_spliced(builder(TurnRequest("m", history, [], 8, wire_cache=cache), False), key, cache)
    first = history[0]
    assert isinstance(first, UserMessage)
    first.text = "first, edited"
    history.append(UserMessage("next"))
    request = TurnRequest("m", history, [], 8, wire_cache=cache)
    spliced = encode_spliced(builder(request, False), key, cache)
    assert spliced == encode_body(builder(request, False))
    assert b"first, edited" in spliced


def test_a_history_replaced_by_extra_body_is_encoded_whole() -> None:
    """An extra_body that replaces the history list with something else still encodes exactly."""
    params = SamplingParams(extra_body={"messages": "not a list"})
    request = TurnRequest("m", [UserMessage("hi")], [], 8, params)
    body = build_chat_body(request, "max_tokens", False)
    assert encode_spliced(body, "messages", {}) == encode_body(body)


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("kind", KINDS)
async def test_adapters_send_the_fresh_encoding(make: Any, kind: str, stream: bool) -> None:
    """What each adapter puts on the wire, turn after turn of one episode, is the fresh encoding."""
    builder, _ = BUILDERS[kind]
    reply = build(kind, Fab(calls=[FabCall("call_9", "refund", '{"order_id":"A"}')]), stream)
    provider, recorder, _ = await make(kind, reply, stream=stream)
    history: list[Message] = [UserMessage("refund A")]
    cache: dict[str, Any] = {}
    for added in [[], *_growth()]:
        history.extend(added)
        request = TurnRequest("m-test", history, [REFUND], 64, wire_cache=cache)
        await provider.complete(request)
        assert recorder.requests[-1].content == encode_body(builder(request, stream))
    assert cache, "the adapter kept no encoded history in the episode's cache"
