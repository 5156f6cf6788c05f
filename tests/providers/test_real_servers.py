"""Issue 31: every wire against fakes shaped like servers nobody here wrote (streamed and not).

The shapes are the measured ones of ../shared/tools/real-llama/README.md and
real-gateway/README.md, built in `tests.providers.realshapes`.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from collector.errors import ProviderError
from collector.providers import build_provider
from collector.providers.base import Endpoint, Provider, RetryPolicy
from collector.providers.servercut import UnparsedArguments
from collector.turn import (
    ArgStatus,
    AssistantMessage,
    FinishClass,
    LengthSignal,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    TurnRequest,
    UserMessage,
)
from tests.providers.conftest import API_KEY, BASE_URLS, Sleeps
from tests.providers.realshapes import (
    COMPLETE_TOKENS,
    WEATHER_ARGS,
    LiteLLMAnthropic,
    LiteLLMGemini,
    LlamaResponses,
    litellm_anthropic_500,
    weather_turn,
)
from tests.providers.wirefab import sse

WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
    },
)

Handler = Callable[[httpx.Request], httpx.Response]
Build = Callable[..., Awaitable[tuple[Provider, Sleeps]]]


@pytest.fixture
async def over() -> AsyncIterator[Build]:
    """An adapter of a kind over a handler (a fake server); clients closed at teardown."""
    clients: list[httpx.AsyncClient] = []

    async def factory(
        kind: str, handler: Handler, *, stream: bool, retries: int = 4
    ) -> tuple[Provider, Sleeps]:
        client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        clients.append(client)
        endpoint = Endpoint(
            BASE_URLS[kind], api_key=API_KEY, streaming=stream, retry=RetryPolicy(max_retries=retries)
        )
        sleeps = Sleeps()
        return build_provider(kind, endpoint, client, sleep=sleeps, rng=random.Random(0)), sleeps

    yield factory
    for client in clients:
        await client.aclose()


def weather_request(cap: int, history: list[Any] | None = None) -> TurnRequest:
    """The few-shot weather request at one cap (the history is what matters to the fakes)."""
    messages: list[Any] = [UserMessage("What is the weather in Paris?"), *(history or [])]
    return TurnRequest(model="gemma3-270m", messages=messages, tools=[WEATHER], max_output_tokens=cap)


MODES = [pytest.param(False, id="json"), pytest.param(True, id="sse")]


# --- 1 and 5: llama-server Responses ----------------------------------------------------------


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("cap", [40, 64, 37])
async def test_llama_responses_complete_call_is_one_call_that_runs(
    over: Build, stream: bool, cap: int
) -> None:
    """A complete call from llama-server's Responses route (stream events without `output_index`)
    is one call with its arguments, not a length turn: the `added` and `done` events of one item
    are one item (keyed by `item_id` when the index is absent), never a second, unfinished call."""
    provider, _ = await over("responses", LlamaResponses(), stream=stream)
    turn = await provider.complete(weather_request(cap))
    assert turn.length_signals == ()
    assert turn.finish_class is FinishClass.TOOL_CALLS
    (call,) = turn.tool_calls
    assert (call.name, call.status, call.arguments) == (
        "get_weather",
        ArgStatus.OK,
        {"city": "Paris", "unit": "celsius"},
    )
    assert call.id == "fc_llamaCALL0001"
    assert turn.usage.output_tokens == COMPLETE_TOKENS


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("cap", [20, 32, COMPLETE_TOKENS])
async def test_llama_responses_cut_is_caught_by_cap_reached_alone(
    over: Build, stream: bool, cap: int
) -> None:
    """llama-server's Responses never says `incomplete` (a cut call item says `completed`), so
    `cap_reached` alone catches each cut: broken arguments (20), valid-looking ones (32) and a
    complete call ending exactly on the cap (36); one call, no stream cut, in both modes."""
    assert weather_turn(cap).cut
    provider, _ = await over("responses", LlamaResponses(), stream=stream)
    turn = await provider.complete(weather_request(cap))
    assert turn.raw_finish_reason == "completed"
    assert turn.incomplete_reason is None
    assert turn.length_signals == (LengthSignal.CAP_REACHED,)
    assert turn.is_length
    (call,) = turn.tool_calls
    assert call.status is (ArgStatus.MALFORMED if cap == 20 else ArgStatus.OK)


@pytest.mark.parametrize("stream", MODES)
async def test_llama_responses_markup_in_content_is_a_cut(over: Build, stream: bool) -> None:
    """At caps 5-13 llama-server leaves the opened call markup as text: a length turn, no call."""
    provider, _ = await over("responses", LlamaResponses(), stream=stream)
    turn = await provider.complete(weather_request(10))
    assert turn.tool_calls == []
    assert turn.text.startswith("<tool_call>")
    assert LengthSignal.CAP_REACHED in turn.length_signals


# --- 2: the history llama-server accepts ------------------------------------------------------


def _history(text: str, arguments: str = WEATHER_ARGS) -> list[Any]:
    call = ToolCall("fc_prev", "get_weather", json.loads(arguments), ArgStatus.OK, raw_arguments=arguments)
    return [
        AssistantMessage(text, [call]),
        ToolResultMessage("fc_prev", "get_weather", '{"temp_c": 18}'),
        AssistantMessage("It is 18 C in Paris."),
        UserMessage("And in Rome?"),
    ]


@pytest.mark.parametrize("stream", MODES)
async def test_assistant_text_goes_back_in_the_item_form_llama_server_accepts(
    over: Build, stream: bool
) -> None:
    """Assistant text is replayed as `{"type": "message", "role": "assistant", content:
    [output_text]}`: llama-server answers the short `{"role", "content"}` form with 400
    "Cannot determine type of 'item'", which ended every multi-turn episode there."""
    server = LlamaResponses()
    provider, _ = await over("responses", server, stream=stream)
    turn = await provider.complete(weather_request(64, _history("Checking.")))
    assert turn.finish_class is FinishClass.TOOL_CALLS
    sent = server.requests[-1]["input"]
    texts = [item for item in sent if item.get("role") == "assistant"]
    assert texts == [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It is 18 C in Paris."}],
        },
    ]


def test_fake_refuses_the_short_form_as_llama_server_does() -> None:
    """The fake is strict where the server is, so the test above can fail: a short assistant
    item is a 400 "Cannot determine type of 'item'"."""
    body = {"model": "m", "max_output_tokens": 64, "input": [{"role": "assistant", "content": "hi"}]}
    reply = LlamaResponses()(
        httpx.Request("POST", "http://x/v1/responses", content=json.dumps(body).encode())
    )
    assert reply.status_code == 400
    assert "Cannot determine type" in reply.json()["error"]["message"]


# --- 4: LiteLLM's Gemini stream reports no usage ------------------------------------------------


async def test_litellm_gemini_stream_usage_is_unknown_not_zero(over: Build) -> None:
    """LiteLLM's Gemini stream sends `usageMetadata` all zeros: the turn's usage is unknown
    (`known=False`), not a count of 0; the non-streamed reply of the same turn is counted."""
    streamed, _ = await over("gemini", LiteLLMGemini(), stream=True)
    whole, _ = await over("gemini", LiteLLMGemini(), stream=False)
    s = await streamed.complete(weather_request(64))
    w = await whole.complete(weather_request(64))
    assert (s.usage.known, s.usage.output_tokens) == (False, 0)
    assert (w.usage.known, w.usage.output_tokens, w.usage.input_tokens) == (True, COMPLETE_TOKENS, 498)
    assert s.finish_class is w.finish_class is FinishClass.TOOL_CALLS


@pytest.mark.parametrize("cap", [20, 32])
async def test_litellm_gemini_stream_cut_is_still_a_cut(over: Build, cap: int) -> None:
    """With usage unknown, a cut is still caught by the finish reason (`MAX_TOKENS`), and no call
    from it exists to run (LiteLLM drops a streamed call cut at the cap)."""
    provider, _ = await over("gemini", LiteLLMGemini(), stream=True)
    turn = await provider.complete(weather_request(cap))
    assert not turn.usage.known
    assert turn.length_signals == (LengthSignal.FINISH_REASON,)
    assert turn.tool_calls == []


@pytest.mark.parametrize("stream", MODES)
async def test_complete_call_on_the_cap_with_and_without_usage(over: Build, stream: bool) -> None:
    """A complete call ending exactly on the cap, reported `STOP`: `cap_reached` makes it a
    length turn where usage is counted (not streamed); where the server counted nothing (the
    stream) the rule cannot see it and the call is a complete tool call (documented in
    `collector.providers.common`, "Unknown usage")."""
    provider, _ = await over("gemini", LiteLLMGemini(), stream=stream)
    turn = await provider.complete(weather_request(COMPLETE_TOKENS))
    assert turn.raw_finish_reason == "STOP"
    if stream:
        assert not turn.usage.known
        assert turn.length_signals == ()
    else:
        assert turn.usage.known
        assert turn.length_signals == (LengthSignal.CAP_REACHED,)


async def test_zero_usage_chunk_does_not_erase_a_real_count(over: Build) -> None:
    """A Gemini stream whose last chunk reports zeros after a real count keeps the real count."""
    call = {"functionCall": {"name": "get_weather", "args": {"city": "Paris", "unit": "celsius"}}}
    chunks = [
        {
            "candidates": [{"content": {"parts": [call], "role": "model"}, "index": 0}],
            "usageMetadata": {"promptTokenCount": 498, "candidatesTokenCount": 36, "totalTokenCount": 534},
        },
        {
            "candidates": [{"content": {"parts": [], "role": "model"}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 0, "candidatesTokenCount": 0, "totalTokenCount": 0},
        },
    ]
    reply = sse([(None, c) for c in chunks])
    provider, _ = await over(
        "gemini",
        lambda _: httpx.Response(200, content=reply, headers={"content-type": "text/event-stream"}),
        stream=True,
    )
    turn = await provider.complete(weather_request(COMPLETE_TOKENS))
    assert (turn.usage.known, turn.usage.output_tokens) == (True, 36)
    assert turn.length_signals == (LengthSignal.CAP_REACHED,)


@pytest.mark.parametrize(
    ("usage", "text", "known"),
    [
        (None, "", False),  # no usage object at all
        ({"prompt_tokens": 0, "completion_tokens": 0}, "hi", False),
        ({"prompt_tokens": 12, "completion_tokens": 0}, "hi", False),  # output shown, none counted
        ({"prompt_tokens": 12, "completion_tokens": 0}, "", True),  # an empty reply, counted
        ({"prompt_tokens": 12, "completion_tokens": 3}, "hi", True),
    ],
)
async def test_usage_known_rule_on_chat(over: Build, usage: Any, text: str, known: bool) -> None:
    """The per-turn rule on another wire (Chat): no usage, all zeros, or 0 output tokens for a
    turn that shows output is unknown; a counted prompt with an empty reply is a measure."""
    body: dict[str, Any] = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
    }
    if usage is not None:
        body["usage"] = usage
    provider, _ = await over("chat", lambda _: httpx.Response(200, json=body), stream=False)
    turn = await provider.complete(weather_request(64))
    assert turn.usage.known is known


# --- 3: LiteLLM's Anthropic 500 on a call cut mid-JSON ---------------------------------------


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("cap", [14, 20, 29])
async def test_litellm_anthropic_cut_call_is_a_length_turn(over: Build, stream: bool, cap: int) -> None:
    """A call cut mid-JSON through LiteLLM's Anthropic route is a length turn in both modes, with
    nothing to run: streamed, the server says `max_tokens`; non-streamed, it answers HTTP 500
    "Failed to parse tool call arguments", which is asked once (never retried: 5 paid
    generations before) and read as the cut (`collector.providers.servercut`)."""
    server = LiteLLMAnthropic()
    provider, sleeps = await over("anthropic", server, stream=stream)
    turn = await provider.complete(weather_request(cap))
    assert turn.is_length
    assert LengthSignal.FINISH_REASON in turn.length_signals
    assert server.requests == 1
    assert sleeps.waits == []
    assert turn.retries == ()
    if not stream:
        assert (turn.raw_finish_reason, turn.incomplete_reason) == (
            "http_500",
            "tool_call_arguments_unparsed",
        )
        assert turn.tool_calls == []
        assert not turn.usage.known


async def test_call_closer_stop_sequence_keeps_the_cut_reading(over: Build) -> None:
    """The sweep's `stop: ["</tool_call>"]` (a base model needs it) ends a call after its
    arguments, so the 500 is still read as the cut; asked once."""
    server = LiteLLMAnthropic()
    provider, _ = await over("anthropic", server, stream=False)
    request = weather_request(20)
    request.params.stop = ["</tool_call>"]
    turn = await provider.complete(request)
    assert turn.is_length
    assert server.requests == 1


async def test_litellm_anthropic_complete_call_runs(over: Build) -> None:
    """The same route at a cap the call fits under is an ordinary tool-call turn (no 500)."""
    provider, _ = await over("anthropic", LiteLLMAnthropic(), stream=False)
    turn = await provider.complete(weather_request(64))
    assert turn.finish_class is FinishClass.TOOL_CALLS
    assert turn.length_signals == ()


FRAGMENT = '{"city": "Pa'


def _gateway_500(_: httpx.Request) -> httpx.Response:
    return httpx.Response(500, json=litellm_anthropic_500(FRAGMENT))


@pytest.mark.parametrize(
    "why",
    ["stop_sequences", "no_tools", "dirty_history"],
)
async def test_unparsed_arguments_500_without_the_cut_conditions_is_an_unretried_error(
    over: Build, why: str
) -> None:
    """When the cap is not the only explanation (a stop sequence could have ended the call, no
    tools were offered, or the history replays arguments that do not parse), the 500 ends the
    episode as an error: asked once, and its message keeps no argument fragment."""
    request = weather_request(20)
    if why == "stop_sequences":
        request.params.stop = ["</tool_call>", "get_weather"]  # the second can match inside a call
    elif why == "no_tools":
        request.tools = []
    else:
        broken = ToolCall("c1", "get_weather", {"city": "Paris"}, ArgStatus.OK, raw_arguments='{"city": "Par')
        request.messages = [
            *request.messages,
            AssistantMessage("", [broken]),
            ToolResultMessage("c1", "get_weather", "x"),
        ]
    calls: list[httpx.Request] = []

    def server(req: httpx.Request) -> httpx.Response:
        calls.append(req)
        return _gateway_500(req)

    provider, sleeps = await over("anthropic", server, stream=False)
    with pytest.raises(UnparsedArguments) as caught:
        await provider.complete(request)
    assert len(calls) == 1
    assert sleeps.waits == []
    message = str(caught.value)
    assert "Failed to parse tool call arguments" in message
    assert "city" not in message
    assert "Pa" not in message.split("arguments", 1)[1]


@pytest.mark.parametrize("kind", ["chat", "responses", "anthropic", "gemini"])
async def test_arguments_fragment_never_in_any_wire_message(over: Build, kind: str) -> None:
    """Every wire scrubs the quoted arguments of such a 500 (in an error or a 4xx alike)."""
    body = litellm_anthropic_500('{"note": "secret plan", "city": "Pa')
    provider, _ = await over(kind, lambda _: httpx.Response(400, json=body), stream=False)
    with pytest.raises(ProviderError) as caught:
        await provider.complete(weather_request(20))
    assert "city" not in str(caught.value)
    assert "secret plan" not in str(caught.value)


async def test_unparsed_arguments_is_not_retried_even_when_the_server_says_retry(over: Build) -> None:
    """`x-should-retry: true` (Anthropic's SDK header) does not make the deterministic failure
    retryable: the server would only generate the same cut again."""
    calls: list[httpx.Request] = []

    def server(req: httpx.Request) -> httpx.Response:
        calls.append(req)
        return httpx.Response(500, json=litellm_anthropic_500(FRAGMENT), headers={"x-should-retry": "true"})

    provider, _ = await over("anthropic", server, stream=False)
    turn = await provider.complete(weather_request(20))
    assert turn.is_length
    assert len(calls) == 1
