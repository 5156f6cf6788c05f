"""Anthropic Messages (`POST {base_url}/v1/messages`); `base_url` is the server root.

Tool input arrives as an *object* (`tool_use.input`) in a whole reply, and as
`input_json_delta.partial_json` text per block in a stream. An object that parses proves
nothing: under `stop_reason: "max_tokens"` the official SDK's own accumulator yields a
syntactically valid but incomplete object, so the turn is marked a length turn and the loop
runs nothing from it. In a stream the fragments are joined and parsed strictly once the
stream ends, so a cut block is MALFORMED *and* the turn is a length turn; a `tool_use` block
that never got its `content_block_stop` by `message_stop` is a `STREAM_CUT` (the docs say
every block is closed; some fixtures do not close the cut one: both are accepted).

`model_context_window_exceeded` is treated as the transport saying "cut" too: the output
stopped short for lack of room. `refusal` (a streaming classifier stepped in) maps to
content_filter, with the category kept in `Turn.refusal`.

Thinking (`thinking` blocks with their `signature`, `redacted_thinking` blocks) is kept in
order as `Turn.reasoning_items`, streamed ones rebuilt from `thinking_delta` and
`signature_delta`, and replayed verbatim before the turn's text and `tool_use` blocks. A
thinking budget is sent as `thinking: {type: "enabled", budget_tokens}`. The API reports no
separate thinking-token count, so `reasoning_tokens` stays 0 on this wire.

History: system messages go to top-level `system`; assistant turns are `text` + `tool_use`
blocks (input `{}` for a call that did not parse); tool results are `tool_result` blocks in
the next user message, first, with any user text after them (the API wants roles to
alternate, so consecutive same-role messages are merged).

Tests: tests/providers/test_scenarios.py, tests/providers/test_wire_examples.py,
tests/providers/test_replay.py, tests/providers/test_real_servers.py.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx

from collector.errors import ProviderError, ProviderUnavailable
from collector.providers.base import Endpoint
from collector.providers.common import (
    as_int,
    call_from_object,
    call_from_text,
    finish_turn,
    merge_extra,
    replay_object,
)
from collector.providers.finish import finish_class
from collector.providers.http import Headers, Http, Sleep
from collector.providers.relay import current_relay
from collector.providers.servercut import or_server_cut
from collector.providers.splice import encode_spliced
from collector.providers.sse import SSEEvent
from collector.turn import (
    AssistantMessage,
    JSONObject,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    Turn,
    TurnRequest,
    Usage,
    UserMessage,
)

__all__ = ["ANTHROPIC_VERSION", "AnthropicProvider", "build_anthropic_body"]

ANTHROPIC_VERSION = "2023-06-01"
"""The `anthropic-version` header: the one every docs example sends."""

_THINKING = frozenset({"thinking", "redacted_thinking"})
_PARSE_ERRORS = (KeyError, TypeError, AttributeError, IndexError, ValueError)
_LENGTH_REASONS = frozenset({"max_tokens", "model_context_window_exceeded"})


def build_anthropic_body(request: TurnRequest, stream: bool) -> JSONObject:
    """The request body, sampling parameters included and `extra_body` merged last."""
    system: list[str] = []
    messages: list[JSONObject] = []

    def add(role: str, block: JSONObject) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": role, "content": [block]})

    for m in request.messages:
        if isinstance(m, ToolResultMessage):
            add(
                "user",
                {
                    "type": "tool_result",
                    "tool_use_id": m.call_id,
                    "content": m.content,
                    "is_error": m.is_error,
                },
            )
        elif isinstance(m, AssistantMessage):
            # Thinking blocks first, exactly as received (signature included): the API answers
            # 400 "Expected `thinking` or `redacted_thinking`, but found `tool_use`" otherwise.
            for item in m.reasoning_items:
                add("assistant", dict(item))
            if (m.text or not m.tool_calls) and not (m.reasoning_items and not m.text):
                add("assistant", {"type": "text", "text": m.text})
            for c in m.tool_calls:
                add("assistant", {"type": "tool_use", "id": c.id, "name": c.name, "input": replay_object(c)})
        elif isinstance(m, UserMessage):
            add("user", {"type": "text", "text": m.text})
        elif isinstance(m, SystemMessage):
            system.append(m.text)
    p = request.params
    body: JSONObject = {"model": request.model, "max_tokens": request.max_output_tokens, "messages": messages}
    if system:
        body["system"] = "\n\n".join(system)
    if request.tools:
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in request.tools
        ]
        choice = p.tool_choice
        if choice == "auto":
            body["tool_choice"] = {"type": "auto"}
        elif choice == "required":
            body["tool_choice"] = {"type": "any"}
        elif choice == "none":
            body["tool_choice"] = {"type": "none"}
        elif choice:
            body["tool_choice"] = {"type": "tool", "name": choice}
    if p.temperature is not None:
        body["temperature"] = p.temperature
    if p.top_p is not None:
        body["top_p"] = p.top_p
    if p.stop:
        body["stop_sequences"] = list(p.stop)
    if p.thinking_budget is not None:
        body["thinking"] = {"type": "enabled", "budget_tokens": p.thinking_budget}
    if stream:
        body["stream"] = True
    if p.extra_body:
        merge_extra(body, p.extra_body)
    return body


def _input_tokens(u: Any) -> int:
    # Total input is the sum of fresh, cache-write and cache-read tokens.
    return (
        as_int(u.get("input_tokens"))
        + as_int(u.get("cache_creation_input_tokens"))
        + as_int(u.get("cache_read_input_tokens"))
    )


def _turn(
    text: str,
    calls: list[ToolCall],
    stop_reason: str | None,
    stop_details: Any,
    usage: Usage,
    cap: int,
    elapsed: float,
    response_id: str | None,
    stream_cut: bool = False,
    model: str | None = None,
    thinking: list[JSONObject] | None = None,
) -> Turn:
    refusal = None
    if stop_reason == "refusal":
        category = stop_details.get("category") if isinstance(stop_details, dict) else None
        refusal = category if isinstance(category, str) else "refusal"
    return finish_turn(
        text=text,
        tool_calls=calls,
        raw_finish_reason=stop_reason,
        mapped=finish_class("anthropic", stop_reason, False),  # the one table (providers.finish)
        says_length=stop_reason in _LENGTH_REASONS,
        usage=usage,
        max_output_tokens=cap,
        latency_s=elapsed,
        stream_cut=stream_cut,
        refusal=refusal,
        response_id=response_id,
        response_model=model,
        reasoning_text="".join(str(b.get("thinking") or "") for b in thinking or ()) or None,
        reasoning_items=thinking,
    )


class AnthropicProvider:
    """The Anthropic Messages adapter. Streaming or not per `Endpoint.streaming`."""

    kind = "anthropic"

    def __init__(
        self,
        endpoint: Endpoint,
        client: httpx.AsyncClient,
        *,
        sleep: Sleep | None = None,
        rng: random.Random | None = None,
    ) -> None:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if endpoint.api_key:
            headers["x-api-key"] = endpoint.api_key
        self._http = Http(client, endpoint, "anthropic", headers, sleep, rng)
        self._url = endpoint.base_url.rstrip("/") + "/v1/messages"
        self._streaming = endpoint.streaming

    async def complete(self, request: TurnRequest) -> Turn:
        streaming = self._streaming or current_relay() is not None
        body = encode_spliced(build_anthropic_body(request, streaming), "messages", request.wire_cache)
        cap = request.max_output_tokens
        extra = request.params.extra_headers
        once = self._stream_once if streaming else self._post_once
        return await or_server_cut(request, self._http.retrying(lambda: once(body, cap, extra)))

    async def _post_once(self, body: bytes, cap: int, extra: Headers) -> Turn:
        payload, elapsed = await self._http.post_json(self._url, body, extra)
        try:
            if payload.get("type") == "error":
                raise self._http.stream_error(payload)
            text: list[str] = []
            calls: list[ToolCall] = []
            thinking: list[JSONObject] = []
            for block in payload["content"]:
                kind = block.get("type")
                if kind in _THINKING:
                    thinking.append(dict(block))
                elif kind == "text":
                    text.append(block.get("text") or "")
                elif kind == "tool_use":
                    calls.append(
                        call_from_object(str(block["id"]), str(block.get("name") or ""), block.get("input"))
                    )
            u = payload.get("usage") or {}
            usage = Usage(_input_tokens(u), as_int(u.get("output_tokens")))
            return _turn(
                "".join(text),
                calls,
                payload.get("stop_reason"),
                payload.get("stop_details"),
                usage,
                cap,
                elapsed,
                payload.get("id"),
                model=payload.get("model"),
                thinking=thinking,
            )
        except _PARSE_ERRORS:
            raise self._http.protocol_error("reply is not an Anthropic message") from None

    async def _stream_once(self, body: bytes, cap: int, extra: Headers) -> Turn:
        state, elapsed = await self._http.stream(self._url, body, self._consume, extra)
        try:
            return state.turn(cap, elapsed)
        except _PARSE_ERRORS:
            raise self._http.protocol_error("stream is not Anthropic events") from None

    async def _consume(self, events: AsyncIterator[SSEEvent]) -> _AnthropicStream:
        state = _AnthropicStream()
        async for event in events:
            try:
                if state.feed(json.loads(event.data), self._http):
                    return state
            except ProviderError:
                raise
            except _PARSE_ERRORS:
                raise self._http.protocol_error("stream event is not an Anthropic event") from None
        raise ProviderUnavailable("anthropic: stream ended without message_stop")


class _AnthropicStream:
    """Blocks by index (text pieces, or a tool_use with its json fragments), reason and usage."""

    __slots__ = (
        "blocks", "input_tokens", "model", "output_tokens", "relay", "response_id", "stop_details",
        "stop_reason",
    )

    def __init__(self) -> None:
        # index -> [type, block_start, pieces, closed]
        self.blocks: dict[int, list[Any]] = {}
        self.stop_reason: str | None = None
        self.stop_details: Any = None
        self.input_tokens = 0
        self.output_tokens = 0
        self.response_id: str | None = None
        self.model: str | None = None
        self.relay = current_relay()

    def feed(self, data: Any, http: Http) -> bool:
        """Apply one event; True at `message_stop`."""
        kind = data.get("type")
        if kind == "content_block_delta":
            block = self.blocks.get(data["index"])
            if block is not None:
                delta = data["delta"]
                dtype = delta.get("type")
                if dtype == "text_delta":
                    block[2].append(delta.get("text") or "")
                    if self.relay is not None:
                        self.relay.text(self, delta.get("text") or "")
                elif dtype == "thinking_delta":
                    block[2].append(delta.get("thinking") or "")
                    if self.relay is not None:
                        self.relay.reasoning(self, delta.get("thinking") or "")
                elif dtype == "signature_delta":
                    block[1] = {**block[1], "signature": delta.get("signature") or ""}
                elif dtype == "input_json_delta":
                    block[2].append(delta.get("partial_json") or "")
        elif kind == "content_block_start":
            cb = data["content_block"]
            self.blocks[data["index"]] = [cb.get("type"), cb, [], False]
        elif kind == "content_block_stop":
            block = self.blocks.get(data["index"])
            if block is not None:
                block[3] = True
        elif kind == "message_delta":
            delta = data.get("delta") or {}
            if delta.get("stop_reason"):
                self.stop_reason = delta["stop_reason"]
                self.stop_details = delta.get("stop_details")
            u = data.get("usage") or {}
            # Counts on message_delta are cumulative: overwrite, never add.
            if "output_tokens" in u:
                self.output_tokens = as_int(u["output_tokens"])
            if "input_tokens" in u:
                self.input_tokens = _input_tokens(u)
        elif kind == "message_start":
            message = data["message"]
            self.response_id = message.get("id")
            self.model = message.get("model")
            u = message.get("usage") or {}
            self.input_tokens = _input_tokens(u)
            self.output_tokens = as_int(u.get("output_tokens"))
        elif kind == "message_stop":
            return True
        elif kind == "error":
            raise http.stream_error(data)
        return False

    def turn(self, cap: int, elapsed: float) -> Turn:
        text: list[str] = []
        calls: list[ToolCall] = []
        thinking: list[JSONObject] = []
        cut = self.stop_reason is None
        for _, (btype, start, pieces, closed) in sorted(self.blocks.items()):
            if btype == "thinking":
                # Rebuilt as the whole reply carries it: the text, then the signature.
                thinking.append({"type": "thinking", "thinking": str(start.get("thinking") or "")
                                 + "".join(pieces), "signature": start.get("signature") or ""})
            elif btype == "redacted_thinking":
                thinking.append(dict(start))
            elif btype == "text":
                text.append("".join(pieces))
            elif btype == "tool_use":
                call_id, name = str(start["id"]), str(start.get("name") or "")
                raw = "".join(pieces)
                if not closed:
                    cut = True
                if closed and not raw.strip():
                    # A call without parameters streams no JSON: its start `input` is the object.
                    calls.append(call_from_object(call_id, name, start.get("input")))
                else:
                    calls.append(call_from_text(call_id, name, raw))
        usage = Usage(self.input_tokens, self.output_tokens)
        return _turn(
            "".join(text),
            calls,
            self.stop_reason,
            self.stop_details,
            usage,
            cap,
            elapsed,
            self.response_id,
            stream_cut=cut,
            model=self.model,
            thinking=thinking,
        )
