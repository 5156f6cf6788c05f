"""OpenAI Responses (`POST {base_url}/responses`); `base_url` includes `/v1` as for chat.

There is no finish reason: a reply has a `status` (kept as the raw reason) and, when
`incomplete`, `incomplete_details.reason` (kept as the incomplete reason). Only
`max_output_tokens` is a length reason; `content_filter` stays a content filter (mapping every
`incomplete` to length is the lossy normalization the field notes warn about). A
`function_call` item whose own status is `incomplete` also counts as the transport saying
"cut", since third-party servers have shipped `response.completed` for truncated output.

Calls carry two ids: the item `id` (`fc_…`) and `call_id` (`call_…`); `call_id` is the one
results link to and the one kept on `ToolCall.id`.

Streaming keys off the terminal event (`response.completed` / `.incomplete` / `.failed`, or
an `error` event), never off `.done` events; a call item added but never finished by the
terminal event is a `STREAM_CUT`. Items are found by `output_index`, or by `item_id` (the
item's `id`) where a server sends no index (llama-server: see `_Items`).

History: system messages go to top-level `instructions` (joined with blank lines), the rest
to `input` items: user messages in the short `{"role", "content"}` form, assistant text as
an explicit `{"type": "message", "role": "assistant", "content": [output_text part]}` item
(llama-server refuses the short form for assistant text; every server takes this one),
`function_call` items (arguments as text, `"{}"` for a call that did not parse) and
`function_call_output` items linked by `call_id`. Responses has no `seed` or `stop`.

Reasoning: `reasoning` output items are kept verbatim (`Turn.reasoning_items`; their
`summary` texts are the reasoning text, `usage.output_tokens_details.reasoning_tokens` the
count) and replayed before the turn's message and function calls: the collector is
stateless, and the API refuses a function call sent back without its reasoning item. An
effort is sent as `reasoning.effort`, with `include: ["reasoning.encrypted_content"]`.

Tests: tests/providers/test_scenarios.py, tests/providers/test_wire_examples.py,
tests/providers/test_real_servers.py, tests/sim/test_llama_responses.py.
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
    call_from_text,
    finish_turn,
    merge_extra,
    replay_text,
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

__all__ = ["ResponsesProvider", "build_responses_body"]

_PARSE_ERRORS = (KeyError, TypeError, AttributeError, IndexError, ValueError)
_TERMINAL = frozenset({"response.completed", "response.incomplete"})


def build_responses_body(request: TurnRequest, stream: bool) -> JSONObject:
    """The request body, sampling parameters included and `extra_body` merged last."""
    instructions: list[str] = []
    items: list[JSONObject] = []
    for m in request.messages:
        if isinstance(m, ToolResultMessage):
            items.append({"type": "function_call_output", "call_id": m.call_id, "output": m.content})
        elif isinstance(m, AssistantMessage):
            # Stateless (no `previous_response_id`): the turn's reasoning items go back
            # verbatim, before its function calls, or the API refuses the calls.
            items.extend(dict(item) for item in m.reasoning_items)
            if m.text:
                # The explicit item form: llama-server refuses the short `{"role", "content"}`
                # form for assistant text (400 "Cannot determine type of 'item'"); OpenAI and
                # LiteLLM take both.
                part = {"type": "output_text", "text": m.text}
                items.append({"type": "message", "role": "assistant", "content": [part]})
            for c in m.tool_calls:
                items.append(
                    {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": replay_text(c)}
                )
        elif isinstance(m, UserMessage):
            items.append({"role": "user", "content": m.text})
        elif isinstance(m, SystemMessage):
            instructions.append(m.text)
    p = request.params
    body: JSONObject = {
        "model": request.model,
        "input": items,
        "max_output_tokens": request.max_output_tokens,
    }
    if instructions:
        body["instructions"] = "\n\n".join(instructions)
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "strict": False,
            }
            for t in request.tools
        ]
        if p.tool_choice:
            if p.tool_choice in ("auto", "none", "required"):
                body["tool_choice"] = p.tool_choice
            else:
                body["tool_choice"] = {"type": "function", "name": p.tool_choice}
    if p.temperature is not None:
        body["temperature"] = p.temperature
    if p.top_p is not None:
        body["top_p"] = p.top_p
    include: list[str] = []
    if p.logprobs:
        include.append("message.output_text.logprobs")
        if p.top_logprobs is not None:
            body["top_logprobs"] = p.top_logprobs
    if p.reasoning_effort is not None:
        body["reasoning"] = {"effort": p.reasoning_effort, "summary": "auto"}
        include.append("reasoning.encrypted_content")
    if include:
        body["include"] = include
    if stream:
        body["stream"] = True
    if p.extra_body:
        merge_extra(body, p.extra_body)
    return body


def _usage(u: Any) -> Usage:
    if not isinstance(u, dict):
        return Usage()
    return Usage(as_int(u.get("input_tokens")), as_int(u.get("output_tokens")))


def _reasoning_tokens(u: Any) -> int:
    details = u.get("output_tokens_details") if isinstance(u, dict) else None
    return as_int(details.get("reasoning_tokens")) if isinstance(details, dict) else 0


def _logprobs_into(entries: Any, into: list[float]) -> None:
    for entry in entries or ():
        value = entry.get("logprob") if isinstance(entry, dict) else None
        if isinstance(value, int | float):
            into.append(float(value))


class _Reply:
    """What one reply amounts to, from a whole body or from stream events."""

    __slots__ = (
        "calls",
        "incomplete",
        "item_cut",
        "logprobs",
        "model",
        "open_calls",
        "reasoning",
        "reasoning_items",
        "reasoning_tokens",
        "refusal",
        "response_id",
        "status",
        "text",
        "usage",
    )

    def __init__(self) -> None:
        self.text: list[str] = []
        self.refusal: list[str] = []
        self.calls: list[ToolCall] = []
        self.status: str | None = None
        self.incomplete: str | None = None
        self.usage = Usage()
        self.logprobs: list[float] = []
        self.item_cut = False
        self.open_calls = False
        self.response_id: str | None = None
        self.model: str | None = None
        self.reasoning = False
        self.reasoning_items: list[JSONObject] = []
        self.reasoning_tokens = 0

    def add_item(self, item: Any, with_text: bool = True) -> None:
        kind = item.get("type")
        if kind == "reasoning":
            self.reasoning = True
            self.reasoning_items.append(dict(item))
        if kind == "function_call":
            if item.get("status") == "incomplete":
                self.item_cut = True
            call_id = item.get("call_id") or item.get("id") or f"call_gen_{len(self.calls)}"
            self.calls.append(call_from_text(call_id, str(item.get("name") or ""), item.get("arguments")))
        elif kind == "message" and with_text:
            for part in item.get("content") or ():
                if part.get("type") == "output_text":
                    self.text.append(part.get("text") or "")
                    _logprobs_into(part.get("logprobs"), self.logprobs)
                elif part.get("type") == "refusal":
                    self.refusal.append(part.get("refusal") or "")

    def end(self, response: Any) -> None:
        self.status = response.get("status")
        details = response.get("incomplete_details")
        if isinstance(details, dict) and isinstance(details.get("reason"), str):
            self.incomplete = details["reason"]
        self.usage = _usage(response.get("usage"))
        self.reasoning_tokens = _reasoning_tokens(response.get("usage"))
        if isinstance(response.get("id"), str):
            self.response_id = response["id"]
        if isinstance(response.get("model"), str):
            self.model = response["model"]

    def turn(self, cap: int, elapsed: float, stream_cut: bool = False) -> Turn:
        status, reason = self.status, self.incomplete
        says_length = (status == "incomplete" and reason == "max_output_tokens") or self.item_cut
        # The one table (providers.finish), keyed `status` or `status:reason`.
        key = f"{status}:{reason}" if status == "incomplete" else status
        mapped = finish_class("responses", key, bool(self.calls))
        return finish_turn(
            text="".join(self.text),
            tool_calls=self.calls,
            raw_finish_reason=status,
            mapped=mapped,
            says_length=says_length,
            usage=self.usage,
            max_output_tokens=cap,
            latency_s=elapsed,
            stream_cut=stream_cut,
            incomplete_reason=reason,
            refusal="".join(self.refusal) or None,
            logprobs=self.logprobs or None,
            response_id=self.response_id,
            response_model=self.model,
            reasoning=self.reasoning,
            reasoning_text="".join(
                str(part.get("text") or "")
                for item in self.reasoning_items
                for part in item.get("summary") or ()
                if isinstance(part, dict)
            ) or None,
            reasoning_tokens=self.reasoning_tokens,
            reasoning_items=self.reasoning_items,
        )


class _Slot:
    """One output item of a stream: the latest item object, its argument fragments, its text."""

    __slots__ = ("finished", "fragments", "index", "item", "order", "text")

    def __init__(self, item: Any, index: int | None, order: int) -> None:
        self.item = item
        self.index = index
        self.order = order
        self.fragments: list[str] = []
        self.text: list[str] = []
        self.finished = False


class _Items:
    """A stream's output items, found by `output_index` or, where a server sends none, by id.

    OpenAI's events carry both `output_index` and `item_id`; llama-server's carry only
    `item_id` (its `output_item.added` / `.done` carry the item with its `id`). Keying by the
    index alone made llama-server's `added` and `done` two items: one complete call and one
    never finished (a `STREAM_CUT`), so every streamed call turn there was cut. Each slot is
    registered under every key an event gives, so a server that sends the index on some
    events and only the id on others still lands on one slot.
    """

    __slots__ = ("by_id", "by_index", "slots")

    def __init__(self) -> None:
        self.slots: list[_Slot] = []
        self.by_index: dict[int, _Slot] = {}
        self.by_id: dict[str, _Slot] = {}

    @staticmethod
    def _keys(data: Any, item: Any) -> tuple[int | None, str | None]:
        index = data.get("output_index")
        item_id = data.get("item_id")
        if not isinstance(item_id, str) and isinstance(item, dict):
            item_id = item.get("id")
        return (
            index if isinstance(index, int) and not isinstance(index, bool) else None,
            item_id if isinstance(item_id, str) and item_id else None,
        )

    def find(self, data: Any, item: Any = None) -> _Slot | None:
        index, item_id = self._keys(data, item)
        slot = self.by_index.get(index) if index is not None else None
        if slot is None and item_id is not None:
            slot = self.by_id.get(item_id)
        if slot is None and index is None and item_id is None and len(self.slots) == 1:
            slot = self.slots[0]  # no key at all: the only item open is the one meant
        if slot is not None:
            self._register(slot, index, item_id)
        return slot

    def open(self, data: Any, item: Any) -> _Slot:
        index, item_id = self._keys(data, item)
        slot = _Slot(item, index, len(self.slots))
        self.slots.append(slot)
        self._register(slot, index, item_id)
        return slot

    def _register(self, slot: _Slot, index: int | None, item_id: str | None) -> None:
        if index is not None:
            self.by_index[index] = slot
            if slot.index is None:
                slot.index = index
        if item_id is not None:
            self.by_id[item_id] = slot

    def in_order(self) -> list[_Slot]:
        """Output order: by `output_index` where every item has one, else as they arrived."""
        if all(slot.index is not None for slot in self.slots):
            return sorted(self.slots, key=lambda slot: (slot.index, slot.order))
        return list(self.slots)


class ResponsesProvider:
    """The Responses adapter. Streaming or not per `Endpoint.streaming`."""

    kind = "responses"

    def __init__(
        self,
        endpoint: Endpoint,
        client: httpx.AsyncClient,
        *,
        sleep: Sleep | None = None,
        rng: random.Random | None = None,
    ) -> None:
        headers = {"authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        self._http = Http(client, endpoint, "responses", headers, sleep, rng)
        self._url = endpoint.base_url.rstrip("/") + "/responses"
        self._streaming = endpoint.streaming

    async def complete(self, request: TurnRequest) -> Turn:
        streaming = self._streaming or current_relay() is not None
        body = encode_spliced(build_responses_body(request, streaming), "input", request.wire_cache)
        cap = request.max_output_tokens
        extra = request.params.extra_headers
        once = self._stream_once if streaming else self._post_once
        return await or_server_cut(request, self._http.retrying(lambda: once(body, cap, extra)))

    async def _post_once(self, body: bytes, cap: int, extra: Headers) -> Turn:
        payload, elapsed = await self._http.post_json(self._url, body, extra)
        try:
            if payload.get("status") == "failed" or (payload.get("error") and "output" not in payload):
                raise self._http.stream_error({"error": payload.get("error") or {}})
            reply = _Reply()
            for item in payload["output"]:
                reply.add_item(item)
            reply.end(payload)
            return reply.turn(cap, elapsed)
        except _PARSE_ERRORS:
            raise self._http.protocol_error("reply is not a Responses object") from None

    async def _stream_once(self, body: bytes, cap: int, extra: Headers) -> Turn:
        (reply, cut), elapsed = await self._http.stream(self._url, body, self._consume, extra)
        try:
            return reply.turn(cap, elapsed, stream_cut=cut)
        except _PARSE_ERRORS:
            raise self._http.protocol_error("stream is not Responses events") from None

    async def _consume(self, events: AsyncIterator[SSEEvent]) -> tuple[_Reply, bool]:
        reply = _Reply()
        items = _Items()
        relay = current_relay()
        async for event in events:
            try:
                data = json.loads(event.data)
                kind = data.get("type") or event.event
                if kind == "response.output_item.added":
                    items.open(data, data["item"])
                elif kind == "response.function_call_arguments.delta":
                    slot = items.find(data)
                    if slot is not None:
                        slot.fragments.append(data.get("delta") or "")
                elif kind == "response.function_call_arguments.done":
                    slot = items.find(data)
                    if slot is not None and isinstance(data.get("arguments"), str):
                        slot.fragments = [data["arguments"]]
                elif kind == "response.output_item.done":
                    slot = items.find(data, data["item"]) or items.open(data, data["item"])
                    slot.item, slot.finished = data["item"], True
                elif kind == "response.output_text.delta":
                    slot = items.find(data) or items.open(data, None)
                    slot.text.append(data.get("delta") or "")
                    if relay is not None:
                        relay.text(reply, data.get("delta") or "")
                    _logprobs_into(data.get("logprobs"), reply.logprobs)
                elif kind == "response.reasoning_summary_text.delta" and relay is not None:
                    relay.reasoning(reply, data.get("delta") or "")  # the summary itself comes whole, done
                elif kind == "response.refusal.delta":
                    reply.refusal.append(data.get("delta") or "")
                elif kind in _TERMINAL:
                    response = data["response"]
                    reply.end(response)
                    return self._settle(reply, items, response)
                elif kind == "response.failed":
                    raise self._http.stream_error({"error": (data.get("response") or {}).get("error") or {}})
                elif kind == "error":
                    raise self._http.stream_error(data)
            except ProviderError:
                raise
            except _PARSE_ERRORS:
                raise self._http.protocol_error("stream event is not a Responses event") from None
        raise ProviderUnavailable("responses: stream ended without a terminal event")

    @staticmethod
    def _settle(reply: _Reply, items: _Items, response: Any) -> tuple[_Reply, bool]:
        cut = False
        if not items.slots:
            # A server that sent only the terminal event: its `output` is the whole reply.
            for item in response.get("output") or ():
                reply.add_item(item)
            return reply, False
        for slot in items.in_order():
            kind = slot.item.get("type") if isinstance(slot.item, dict) else None
            if kind == "function_call":
                item = dict(slot.item)
                if slot.finished:
                    if not isinstance(item.get("arguments"), str):
                        item["arguments"] = "".join(slot.fragments)
                else:
                    cut = True  # the call never reached output_item.done
                    item["arguments"] = "".join(slot.fragments)
                reply.add_item(item)
            elif kind == "reasoning":
                reply.add_item(slot.item)  # the `output_item.done` item: summary and encrypted content
            elif slot.text:
                reply.text.append("".join(slot.text))
        return reply, cut
