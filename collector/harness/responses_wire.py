"""The gateway's OpenAI Responses route: `/v1/responses` in, the enforced turn out.

Inbound, `instructions` and the `input` items become the neutral conversation: messages (a
string or `input_text` / `output_text` parts), `function_call` items (consecutive ones join
the assistant turn before them) and `function_call_output` items; reasoning items a harness
replays are not forwarded (the upstream may be any wire). `previous_response_id` is refused:
the gateway stores nothing between requests, so the harness sends its whole input (the
Agents SDK does by default). Only `function` tools are taken.

Outbound, a `response`: a `message` item with the text, the returned calls as
`function_call` items, and `status: "incomplete"` with `incomplete_details.reason:
"max_output_tokens"` for a withheld turn (the wire's own truncation signal). Streamed, the
Responses events in their order, written once the turn is classified.

Tests: tests/harness/test_gateway_responses.py.
"""

from __future__ import annotations

import json
import time
from typing import Any

from collector.harness.request import BadRequest, GatewayTurn, HarnessRequest, text_of
from collector.providers.common import call_from_text, replay_text
from collector.turn import (
    AssistantMessage,
    JSONObject,
    Message,
    SystemMessage,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)

__all__ = ["parse_responses_request", "render_response", "render_response_stream"]

_ROLES = {"user": UserMessage, "system": SystemMessage, "developer": SystemMessage}


def _items(raw: list[Any]) -> list[Message]:
    messages: list[Message] = []
    names: dict[str, str] = {}
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{i}]: must be an object")
        kind = item.get("type", "message")
        where = f"input[{i}]"
        if kind == "message":
            role = item.get("role")
            text = text_of(item.get("content"), f"{where}.content")
            if role == "assistant":
                messages.append(AssistantMessage(text))
            elif role in _ROLES:
                messages.append(_ROLES[role](text))
            else:
                raise BadRequest(f"{where}.role: {str(role)[:32]!r} is not one of user, system, developer, "
                                 "assistant")
        elif kind == "function_call":
            if not isinstance(item.get("call_id"), str):
                raise BadRequest(f"{where}.call_id: must be a string")
            call = call_from_text(item["call_id"], item.get("name", ""), item.get("arguments", ""))
            names[call.id] = call.name
            last = messages[-1] if messages else None
            if isinstance(last, AssistantMessage):  # the calls of the turn whose text came just before
                last.tool_calls.append(call)
            else:
                messages.append(AssistantMessage("", [call]))
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise BadRequest(f"{where}.call_id: must be a string")
            output = text_of(item.get("output"), f"{where}.output")
            messages.append(ToolResultMessage(call_id, names.get(call_id, ""), output))
        elif kind != "reasoning":
            raise BadRequest(f"{where}.type: {str(kind)[:32]!r} is not supported (message, function_call, "
                             "function_call_output)")
    return messages


def parse_responses_request(body: dict[str, Any]) -> HarnessRequest:
    """The harness's Responses body as a `HarnessRequest` (see the module docstring)."""
    if body.get("previous_response_id"):
        raise BadRequest("previous_response_id: the gateway keeps no state between requests; send the "
                         "whole input")
    messages: list[Message] = []
    if body.get("instructions"):
        messages.append(SystemMessage(text_of(body["instructions"], "instructions")))
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append(UserMessage(raw))
    elif isinstance(raw, list) and raw:
        messages.extend(_items(raw))
    else:
        raise BadRequest("input: must be a string or a non-empty list of items")
    tools: list[ToolSpec] = []
    for i, t in enumerate(body.get("tools") or []):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("name"), str):
            raise BadRequest(f"tools[{i}]: only function tools (type, name, parameters) are supported")
        parameters = t.get("parameters") or {"type": "object", "properties": {}}
        tools.append(ToolSpec(t["name"], str(t.get("description") or ""), parameters))
    asked = body.get("max_output_tokens")
    if asked is not None and (not isinstance(asked, int) or isinstance(asked, bool)):
        raise BadRequest("max_output_tokens: must be an integer")
    return HarnessRequest(messages, tools, asked, bool(body.get("stream")), str(body.get("model") or ""))


def _output(turn: GatewayTurn, final: bool) -> list[JSONObject]:
    items: list[JSONObject] = []
    cut = turn.finish_reason == "length"
    if turn.text:
        items.append({"id": "msg_" + turn.response_id, "type": "message", "role": "assistant",
                      "status": ("incomplete" if cut else "completed") if final else "in_progress",
                      "content": [_part(turn.text)] if final else []})
    for call in turn.returned:
        items.append({"id": "fc_" + call.id, "type": "function_call",
                      "status": "completed" if final else "in_progress",
                      "arguments": replay_text(call) if final else "", "call_id": call.id, "name": call.name})
    return items


def _part(text: str) -> JSONObject:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def render_response(turn: GatewayTurn, model: str, status: str | None = None) -> JSONObject:
    """The `response` object the harness receives for `turn` (`status` given: as announced mid-stream)."""
    final = status is None
    status = status or ("incomplete" if turn.finish_reason == "length" else "completed")
    usage = turn.usage
    created = int(time.time())
    return {
        "id": "resp_" + turn.response_id, "object": "response", "created_at": created, "status": status,
        "completed_at": created if status == "completed" else None, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": None, "model": model, "output": _output(turn, True) if final else [],
        "parallel_tool_calls": True, "previous_response_id": None, "tool_choice": "auto", "tools": [],
        "usage": {"input_tokens": usage.input_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": usage.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": usage.input_tokens + usage.output_tokens} if final else None,
    }


def render_response_stream(turn: GatewayTurn, model: str) -> list[str]:
    """The Responses stream events for `turn`, in the wire's order, terminal event last."""
    events: list[str] = []

    def emit(kind: str, payload: JSONObject) -> None:
        data = {"type": kind, "sequence_number": len(events), **payload}
        events.append(f"event: {kind}\ndata: " + json.dumps(data, separators=(",", ":")) + "\n\n")

    emit("response.created", {"response": render_response(turn, model, "in_progress")})
    emit("response.in_progress", {"response": render_response(turn, model, "in_progress")})
    for index, (first, last) in enumerate(zip(_output(turn, False), _output(turn, True), strict=True)):
        emit("response.output_item.added", {"output_index": index, "item": first})
        if last["type"] == "message":
            where = {"item_id": last["id"], "output_index": index, "content_index": 0}
            emit("response.content_part.added", {**where, "part": _part("")})
            emit("response.output_text.delta", {**where, "delta": turn.text, "logprobs": []})
            emit("response.output_text.done", {**where, "text": turn.text, "logprobs": []})
            emit("response.content_part.done", {**where, "part": _part(turn.text)})
        else:
            where = {"item_id": last["id"], "output_index": index}
            emit("response.function_call_arguments.delta", {**where, "delta": last["arguments"]})
            emit("response.function_call_arguments.done", {**where, "arguments": last["arguments"]})
        emit("response.output_item.done", {"output_index": index, "item": last})
    final = render_response(turn, model)
    emit(f"response.{final['status']}", {"response": final})
    return events
