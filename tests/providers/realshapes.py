"""Fakes shaped like the real servers of ../shared/tools/real-llama and real-gateway (issue 31).

Each fake answers what the measured server answers (real-llama/README.md,
real-gateway/README.md), not what the spec says: llama-server's Responses route (no
`output_index` on stream events, `status: "completed"` even for a cut, the short assistant
item refused), LiteLLM's Anthropic route (HTTP 500 when the model's call was cut mid-JSON)
and LiteLLM's Gemini stream (`usageMetadata` all zeros). The weather model is the measured
max_tokens sweep of Gemma 3 270M on one few-shot weather request, so a test can ask "what
does the server answer at cap N" and get the band the README measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from tests.providers.wirefab import sse

WEATHER_ARGS = '{"city": "Paris", "unit": "celsius"}'
"""The arguments of the complete weather call (36 output tokens with its markup)."""
COMPLETE_TOKENS = 36
"""Output tokens of the complete call: at cap 36 it ends exactly on the cap."""


@dataclass(frozen=True)
class WeatherTurn:
    """What llama-server generated for the weather request at one cap (README's bands)."""

    content: str
    """Text the server left in `content` (markup it did not parse), else ""."""
    arguments: str | None
    """The parsed call's argument text, or None when the server parsed no call."""
    output_tokens: int
    cut: bool
    """The generation stopped at the cap (finish `length` on the Chat route)."""


def weather_turn(cap: int) -> WeatherTurn:
    """The measured band for `max_tokens = cap` (1-4, 5-13, 14-29, 30-35, 36, 37+)."""
    if cap <= 4:
        return WeatherTurn("<tool"[: max(1, cap)], None, cap, True)
    if cap <= 13:
        return WeatherTurn('<tool_call>\n{"name": "get_'[: 8 + cap * 2], None, cap, True)
    if cap <= 29:
        # Broken JSON arguments: a proper prefix of the complete ones, growing with the cap.
        size = max(1, (len(WEATHER_ARGS) - 2) * (cap - 13) // 17)
        return WeatherTurn("", WEATHER_ARGS[:size], cap, True)
    if cap <= 35:
        return WeatherTurn("", WEATHER_ARGS, cap, True)  # valid-looking JSON, still cut
    return WeatherTurn("", WEATHER_ARGS, COMPLETE_TOKENS, cap == COMPLETE_TOKENS)


# --- llama-server /v1/responses -----------------------------------------------------------------


def _llama_output(turn: WeatherTurn) -> list[dict[str, Any]]:
    output: list[dict[str, Any]] = []
    if turn.content:
        output.append(
            {
                "type": "message",
                "status": "completed",
                "id": "msg_llama0001",
                "role": "assistant",
                "content": [{"type": "output_text", "annotations": [], "text": turn.content}],
            }
        )
    if turn.arguments is not None:
        # A cut call still says `completed`: this server never reports `incomplete`.
        output.append(
            {
                "type": "function_call",
                "status": "completed",
                "arguments": turn.arguments,
                "call_id": "fc_llamaCALL0001",
                "name": "get_weather",
                "id": "fc_llamaCALL0001",
            }
        )
    return output


def llama_responses_body(turn: WeatherTurn, in_tokens: int = 498) -> dict[str, Any]:
    """llama-server's non-streamed Responses reply: `completed` whatever the cap did."""
    return {
        "completed_at": 1764600000,
        "created_at": 1764600000,
        "id": "resp_llama0001",
        "model": "gemma3-270m",
        "object": "response",
        "output": _llama_output(turn),
        "status": "completed",
        "usage": {
            "input_tokens": in_tokens,
            "output_tokens": turn.output_tokens,
            "total_tokens": in_tokens + turn.output_tokens,
        },
    }


def llama_responses_stream(turn: WeatherTurn, in_tokens: int = 498) -> bytes:
    """llama-server's streamed Responses reply: items named by `item_id` only, no `output_index`."""
    final = llama_responses_body(turn, in_tokens)
    events: list[tuple[str | None, Any]] = []

    def ev(kind: str, **data: Any) -> None:
        events.append((kind, {"type": kind, **data}))

    start = {**final, "status": "in_progress", "output": [], "usage": None}
    ev("response.created", response=start)
    ev("response.in_progress", response=start)
    for item in final["output"]:
        if item["type"] == "message":
            text = item["content"][0]["text"]
            ev("response.output_item.added", item={**item, "status": "in_progress", "content": []})
            ev("response.content_part.added", item_id=item["id"], part={"type": "output_text", "text": ""})
            for i in range(0, len(text), 3):
                ev("response.output_text.delta", item_id=item["id"], delta=text[i : i + 3])
            ev("response.output_text.done", item_id=item["id"], text=text)
            ev("response.content_part.done", item_id=item["id"], part=item["content"][0])
        else:
            ev("response.output_item.added", item={**item, "status": "in_progress", "arguments": ""})
            args = item["arguments"]
            for i in range(0, len(args), 4):
                ev("response.function_call_arguments.delta", item_id=item["id"], delta=args[i : i + 4])
            ev("response.function_call_arguments.done", item_id=item["id"], arguments=args)
        ev("response.output_item.done", item=item)
    ev("response.completed", response=final)
    return sse(events)


class LlamaResponses:
    """A MockTransport handler answering like llama-server's /v1/responses at the request's cap.

    It refuses what the real server refuses: an input item with a `role` and no `type` whose
    role is `assistant` (400 "Cannot determine type of 'item'"), and replayed call arguments
    that are not JSON (500, its template parses history).
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        for item in body.get("input") or ():
            if isinstance(item, dict) and "type" not in item and item.get("role") == "assistant":
                return httpx.Response(
                    400,
                    json={
                        "error": {
                            "code": 400,
                            "message": "Cannot determine type of 'item'",
                            "type": "invalid_request_error",
                        }
                    },
                )
            if isinstance(item, dict) and item.get("type") == "function_call":
                try:
                    json.loads(item.get("arguments") or "")
                except ValueError:
                    return httpx.Response(
                        500,
                        json={
                            "error": {
                                "code": 500,
                                "message": "Failed to parse tool call arguments as JSON",
                                "type": "server_error",
                            }
                        },
                    )
        turn = weather_turn(int(body["max_output_tokens"]))
        if body.get("stream"):
            return httpx.Response(
                200, content=llama_responses_stream(turn), headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(200, json=llama_responses_body(turn))


# --- LiteLLM 1.106.12 -> llama-server chat: Gemini generateContent ------------------------------

_ZERO_USAGE = {"promptTokenCount": 0, "candidatesTokenCount": 0, "totalTokenCount": 0}


def litellm_gemini_body(turn: WeatherTurn, in_tokens: int = 498) -> dict[str, Any]:
    """LiteLLM's non-streamed Gemini reply: counts present; `args: {}` for a cut call; a
    complete call ending exactly on the cap says `STOP` (it maps the engine's `tool_calls`)."""
    parts: list[dict[str, Any]] = []
    if turn.content:
        parts.append({"text": turn.content})
    if turn.arguments is not None:
        try:
            args = json.loads(turn.arguments)
        except ValueError:
            args = {}
        parts.append({"functionCall": {"name": "get_weather", "args": args}})
    complete_call = turn.arguments is not None and turn.output_tokens == COMPLETE_TOKENS
    finish = "STOP" if complete_call else "MAX_TOKENS" if turn.cut else "STOP"
    return {
        "candidates": [{"content": {"parts": parts, "role": "model"}, "finishReason": finish, "index": 0}],
        "usageMetadata": {
            "promptTokenCount": in_tokens,
            "candidatesTokenCount": turn.output_tokens,
            "totalTokenCount": in_tokens + turn.output_tokens,
        },
    }


def litellm_gemini_stream(turn: WeatherTurn) -> bytes:
    """LiteLLM's Gemini stream: every chunk's `usageMetadata` all zeros; a cut call never
    appears (a call is emitted only once its arguments parse); the last chunk has the reason."""
    whole = litellm_gemini_body(turn)
    candidate = whole["candidates"][0]
    parts = candidate["content"]["parts"]
    finish = candidate["finishReason"]
    if finish == "MAX_TOKENS":
        parts = [p for p in parts if "functionCall" not in p]
    chunks: list[dict[str, Any]] = [
        {
            "candidates": [{"content": {"parts": [p], "role": "model"}, "index": 0}],
            "usageMetadata": _ZERO_USAGE,
        }
        for p in parts
    ]
    chunks.append(
        {
            "candidates": [{"content": {"parts": [], "role": "model"}, "finishReason": finish, "index": 0}],
            "usageMetadata": _ZERO_USAGE,
        }
    )
    return sse([(None, c) for c in chunks])


class LiteLLMGemini:
    """A MockTransport handler answering like LiteLLM's Gemini route at the request's cap."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        turn = weather_turn(int(body["generationConfig"]["maxOutputTokens"]))
        if ":streamGenerateContent" in request.url.path:
            return httpx.Response(
                200, content=litellm_gemini_stream(turn), headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(200, json=litellm_gemini_body(turn))


# --- LiteLLM 1.106.12 -> llama-server chat: Anthropic Messages ----------------------------------


def litellm_anthropic_500(fragment: str) -> dict[str, Any]:
    """LiteLLM's error body when its adapter cannot decode the engine's cut call: the message
    quotes the cut arguments after the wording (that quote must never be stored)."""
    return {
        "error": {
            "message": "litellm.APIConnectionError: Failed to parse tool call arguments for tool "
            f"'get_weather': Expecting ',' delimiter: line 1 column 12. Arguments: {fragment}",
            "type": None,
            "param": None,
            "code": "500",
        }
    }


def litellm_anthropic_stream(turn: WeatherTurn, in_tokens: int = 498) -> bytes:
    """LiteLLM's streamed Anthropic reply: the call's `input_json_delta` fragments, then
    `stop_reason: max_tokens` for a cut (it does not decode a streamed call's arguments)."""
    events: list[tuple[str | None, Any]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_gw",
                    "type": "message",
                    "role": "assistant",
                    "model": "gemma3-270m",
                    "content": [],
                    "stop_reason": None,
                    "usage": {"input_tokens": in_tokens, "output_tokens": 0},
                },
            },
        ),
    ]
    if turn.arguments is not None:
        block = {"type": "tool_use", "id": "call_get_weather", "name": "get_weather", "input": {}}
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block})
        )
        args = turn.arguments
        for i in range(0, len(args), 5):
            delta = {"type": "input_json_delta", "partial_json": args[i : i + 5]}
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    reason = "max_tokens" if turn.cut else "tool_use"
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason},
                "usage": {"output_tokens": turn.output_tokens},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return sse(events)


class LiteLLMAnthropic:
    """A MockTransport handler answering like LiteLLM's /v1/messages at the request's cap:
    non-streamed, a call cut mid-JSON is an HTTP 500; streamed, a `max_tokens` stream."""

    def __init__(self) -> None:
        self.requests = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        body = json.loads(request.content)
        turn = weather_turn(int(body["max_tokens"]))
        if body.get("stream"):
            return httpx.Response(
                200, content=litellm_anthropic_stream(turn), headers={"content-type": "text/event-stream"}
            )
        if turn.arguments is not None:
            try:
                args = json.loads(turn.arguments)
            except ValueError:
                return httpx.Response(500, json=litellm_anthropic_500(turn.arguments))
        else:
            args = None
        content: list[dict[str, Any]] = [{"type": "text", "text": turn.content}] if turn.content else []
        if args is not None:
            content.append(
                {"type": "tool_use", "id": "call_get_weather", "name": "get_weather", "input": args}
            )
        reason = "max_tokens" if turn.cut else "tool_use"
        return httpx.Response(
            200,
            json={
                "id": "msg_gw",
                "type": "message",
                "role": "assistant",
                "model": "gemma3-270m",
                "content": content,
                "stop_reason": reason,
                "stop_sequence": None,
                "usage": {"input_tokens": 498, "output_tokens": turn.output_tokens},
            },
        )
