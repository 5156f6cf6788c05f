"""Build replies in each of the four wire formats, whole and as SSE, from one small description.

The shapes follow provider-protocols.md (and the files in `wire/`, copied from
../shared/docs/wire-examples so the suite runs on a clean clone). Tests describe a turn once
(text, calls, whether the transport reports the cap, output tokens) and get it in every
transport and mode, so one scenario checks all eight paths.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

WIRE = Path(__file__).parent / "wire"
KINDS = ("chat", "responses", "anthropic", "gemini")
MODES = (False, True)


@dataclass
class FabCall:
    id: str
    name: str
    args_text: str
    """The argument text a text transport carries (chat, responses, anthropic stream)."""
    args_obj: dict[str, Any] | None = None
    """The object an object transport carries (anthropic whole reply, gemini); None: no call."""


@dataclass
class Fab:
    calls: list[FabCall] = field(default_factory=list)
    text: str = ""
    cut: bool = False
    """The transport's own vocabulary reports the cap."""
    out_tokens: int = 10
    in_tokens: int = 5


def sse(events: list[tuple[str | None, Any]]) -> bytes:
    out = []
    for name, data in events:
        payload = data if isinstance(data, str) else json.dumps(data)
        out.append((f"event: {name}\n" if name else "") + f"data: {payload}\n\n")
    return "".join(out).encode()


def _pieces(text: str, size: int = 5) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def chat(f: Fab, stream: bool, finish: str | None = None) -> bytes:
    finish = finish or ("length" if f.cut else "tool_calls" if f.calls else "stop")
    usage = {
        "prompt_tokens": f.in_tokens,
        "completion_tokens": f.out_tokens,
        "total_tokens": f.in_tokens + f.out_tokens,
    }
    if not stream:
        message: dict[str, Any] = {"role": "assistant", "content": f.text or None}
        if f.calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.args_text}}
                for c in f.calls
            ]
        body = {
            "id": "chatcmpl-fab",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": usage,
        }
        return json.dumps(body).encode()
    base = {"id": "chatcmpl-fab", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events: list[tuple[str | None, Any]] = []

    def chunk(delta: dict[str, Any], fin: str | None = None) -> None:
        events.append(
            (None, {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": fin}], "usage": None})
        )

    chunk({"role": "assistant", "content": ""})
    for piece in _pieces(f.text) if f.text else []:
        chunk({"content": piece})
    for i, c in enumerate(f.calls):
        chunk(
            {
                "tool_calls": [
                    {
                        "index": i,
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": ""},
                    }
                ]
            }
        )
        for piece in _pieces(c.args_text):
            chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
    chunk({}, finish)
    events.append((None, {**base, "choices": [], "usage": usage}))
    events.append((None, "[DONE]"))
    return sse(events)


def responses(f: Fab, stream: bool) -> bytes:
    status = "incomplete" if f.cut else "completed"
    details = {"reason": "max_output_tokens"} if f.cut else None
    output: list[dict[str, Any]] = []
    if f.text:
        output.append(
            {
                "id": "msg_fab",
                "type": "message",
                "role": "assistant",
                "status": status,
                "content": [{"type": "output_text", "text": f.text, "annotations": []}],
            }
        )
    for c in f.calls:
        output.append(
            {
                "id": f"fc_{c.id}",
                "type": "function_call",
                "status": status,
                "call_id": c.id,
                "name": c.name,
                "arguments": c.args_text,
            }
        )
    usage = {
        "input_tokens": f.in_tokens,
        "output_tokens": f.out_tokens,
        "total_tokens": f.in_tokens + f.out_tokens,
    }
    response = {
        "id": "resp_fab",
        "object": "response",
        "status": status,
        "incomplete_details": details,
        "output": output,
        "usage": usage,
    }
    if not stream:
        return json.dumps(response).encode()
    seq = iter(range(1000))
    events: list[tuple[str | None, Any]] = []

    def ev(name: str, **data: Any) -> None:
        events.append((name, {"type": name, "sequence_number": next(seq), **data}))

    start = {**response, "status": "in_progress", "incomplete_details": None, "output": [], "usage": None}
    ev("response.created", response=start)
    for index, item in enumerate(output):
        if item["type"] == "message":
            ev("response.output_item.added", output_index=index, item={**item, "content": []})
            for piece in _pieces(f.text):
                ev(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    delta=piece,
                )
        else:
            ev(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            for piece in _pieces(item["arguments"]):
                ev(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=piece,
                )
            ev(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=item["arguments"],
            )
        ev("response.output_item.done", output_index=index, item=item)
    ev("response.incomplete" if f.cut else "response.completed", response=response)
    return sse(events)


def anthropic(f: Fab, stream: bool, close_cut_block: bool = True) -> bytes:
    stop = "max_tokens" if f.cut else "tool_use" if f.calls else "end_turn"
    if not stream:
        content: list[dict[str, Any]] = []
        if f.text:
            content.append({"type": "text", "text": f.text})
        for c in f.calls:
            content.append({"type": "tool_use", "id": c.id, "name": c.name, "input": c.args_obj or {}})
        body = {
            "id": "msg_fab",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": f.in_tokens, "output_tokens": f.out_tokens},
        }
        return json.dumps(body).encode()
    events: list[tuple[str | None, Any]] = []

    def ev(name: str, **data: Any) -> None:
        events.append((name, {"type": name, **data}))

    message = {
        "id": "msg_fab",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [],
        "stop_reason": None,
    }
    ev("message_start", message={**message, "usage": {"input_tokens": f.in_tokens, "output_tokens": 1}})
    index = 0
    if f.text:
        ev("content_block_start", index=0, content_block={"type": "text", "text": ""})
        ev("ping")
        for piece in _pieces(f.text):
            ev("content_block_delta", index=0, delta={"type": "text_delta", "text": piece})
        ev("content_block_stop", index=0)
        index = 1
    for n, c in enumerate(f.calls):
        block = {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}
        ev("content_block_start", index=index, content_block=block)
        ev("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": ""})
        for piece in _pieces(c.args_text):
            ev("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": piece})
        last = n == len(f.calls) - 1
        if close_cut_block or not (f.cut and last):
            ev("content_block_stop", index=index)
        index += 1
    ev(
        "message_delta",
        delta={"stop_reason": stop, "stop_sequence": None},
        usage={"output_tokens": f.out_tokens},
    )
    ev("message_stop")
    return sse(events)


def gemini(f: Fab, stream: bool) -> bytes:
    finish = "MAX_TOKENS" if f.cut else "STOP"
    parts: list[dict[str, Any]] = []
    if f.text:
        parts.append({"text": f.text})
    for c in f.calls:
        if c.args_obj is not None:
            parts.append({"functionCall": {"id": c.id, "name": c.name, "args": c.args_obj}})
    usage = {"promptTokenCount": f.in_tokens, "candidatesTokenCount": f.out_tokens, "totalTokenCount": 0}
    whole = {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}],
        "usageMetadata": usage,
        "responseId": "fab",
    }
    if not stream:
        return json.dumps(whole).encode()
    events: list[tuple[str | None, Any]] = []
    for part in parts[:-1]:
        events.append((None, {"candidates": [{"content": {"role": "model", "parts": [part]}, "index": 0}]}))
    last_parts = parts[-1:] if parts else []
    events.append(
        (
            None,
            {
                "candidates": [
                    {"content": {"role": "model", "parts": last_parts}, "finishReason": finish, "index": 0}
                ],
                "usageMetadata": usage,
                "responseId": "fab",
            },
        )
    )
    return sse(events)


def build(kind: str, f: Fab, stream: bool) -> bytes:
    return {"chat": chat, "responses": responses, "anthropic": anthropic, "gemini": gemini}[kind](f, stream)


class Recorder:
    """A MockTransport handler that replays scripted replies in order and records requests."""

    def __init__(self, *replies: httpx.Response | bytes | Exception, stream: bool = False) -> None:
        self.replies = list(replies)
        self.requests: list[httpx.Request] = []
        self.stream = stream

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        reply = self.replies[min(len(self.requests), len(self.replies)) - 1]
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, httpx.Response):
            return reply
        ctype = "text/event-stream" if self.stream else "application/json"
        return httpx.Response(200, content=reply, headers={"content-type": ctype})

    def body(self, n: int = -1) -> Any:
        return json.loads(self.requests[n].content)
