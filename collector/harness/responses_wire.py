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
Responses events in their order (`ResponseStream`): the text as it comes, the calls once
the turn is classified (`collector.harness.stream`).

Tests: tests/harness/test_gateway_responses.py, tests/harness/test_stream.py.
"""

from __future__ import annotations

import dataclasses
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
    Usage,
    UserMessage,
)

__all__ = ["ResponseStream", "parse_responses_request", "render_response"]

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


class ResponseStream:
    """The Responses events of one streamed reply, in the wire's order (`collector.harness.stream`).

    Text opens a `message` item and reasoning a `reasoning` item with one summary part, each
    closed when the other kind of text comes or the turn ends; the returned calls' items come
    after the turn is classified (none of a withheld turn); the terminal event is
    `response.completed`, or `response.incomplete` for a withheld turn."""

    def __init__(self, response_id: str, model: str) -> None:
        self.response_id, self.model = response_id, model
        self.sequence = 0
        self.items: list[JSONObject] = []
        """The output items closed so far, as the terminal event lists them."""
        self.open: JSONObject | None = None
        self.parts: list[str] = []

    def _emit(self, kind: str, payload: JSONObject) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **payload}
        self.sequence += 1
        return f"event: {kind}\ndata: " + json.dumps(data, separators=(",", ":")) + "\n\n"

    def _response(self, status: str) -> JSONObject:
        blank = GatewayTurn("", [], [], "stop", Usage(), self.response_id)
        return render_response(blank, self.model, status)

    def _item(self, what: str, index: int, item: JSONObject) -> str:
        return self._emit(f"response.output_item.{what}", {"output_index": index, "item": item})

    def start(self) -> list[str]:
        return [self._emit("response.created", {"response": self._response("in_progress")}),
                self._emit("response.in_progress", {"response": self._response("in_progress")})]

    def _where(self) -> JSONObject:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.items)}

    def _switch(self, kind: str) -> list[str]:
        if self.open is not None and self.open["type"] == kind:
            return []
        events = self._close("completed")
        index = len(self.items)
        if kind == "message":
            self.open = {"id": f"msg_{self.response_id}_{index}", "type": "message", "role": "assistant",
                         "status": "in_progress", "content": []}
            events.append(self._item("added", index, self.open))
            events.append(self._emit("response.content_part.added",
                                     {**self._where(), "content_index": 0, "part": _part("")}))
        else:
            self.open = {"id": f"rs_{self.response_id}_{index}", "type": "reasoning", "summary": []}
            events.append(self._item("added", index, self.open))
            events.append(self._emit("response.reasoning_summary_part.added", {
                **self._where(), "summary_index": 0, "part": {"type": "summary_text", "text": ""}}))
        return events

    def _close(self, status: str) -> list[str]:
        if self.open is None:
            return []
        where, text = self._where(), "".join(self.parts)
        item = self.open
        if item["type"] == "message":
            events = [self._emit("response.output_text.done", {**where, "content_index": 0, "text": text,
                                                               "logprobs": []}),
                      self._emit("response.content_part.done", {**where, "content_index": 0,
                                                                "part": _part(text)})]
            item = {**item, "status": status, "content": [_part(text)]}
        else:
            part = {"type": "summary_text", "text": text}
            events = [self._emit("response.reasoning_summary_text.done", {**where, "summary_index": 0,
                                                                          "text": text}),
                      self._emit("response.reasoning_summary_part.done", {**where, "summary_index": 0,
                                                                          "part": part})]
            item = {**item, "summary": [part]}
        events.append(self._item("done", len(self.items), item))
        self.items.append(item)
        self.open, self.parts = None, []
        return events

    def text(self, delta: str) -> list[str]:
        events = self._switch("message")
        self.parts.append(delta)
        events.append(self._emit("response.output_text.delta", {**self._where(), "content_index": 0,
                                                                "delta": delta, "logprobs": []}))
        return events

    def reasoning(self, delta: str) -> list[str]:
        events = self._switch("reasoning")
        self.parts.append(delta)
        events.append(self._emit("response.reasoning_summary_text.delta",
                                 {**self._where(), "summary_index": 0, "delta": delta}))
        return events

    def finish(self, turn: GatewayTurn) -> list[str]:
        events = self._close("incomplete" if turn.finish_reason == "length" else "completed")
        for item in _output(dataclasses.replace(turn, text=""), True):
            index = len(self.items)
            where = {"item_id": item["id"], "output_index": index}
            added = {**item, "status": "in_progress", "arguments": ""}
            arguments = item["arguments"]
            events.append(self._item("added", index, added))
            events.append(self._emit("response.function_call_arguments.delta", {**where, "delta": arguments}))
            events.append(self._emit("response.function_call_arguments.done",
                                     {**where, "arguments": arguments}))
            events.append(self._item("done", index, item))
            self.items.append(item)
        final = {**render_response(turn, self.model), "id": "resp_" + self.response_id, "output": self.items}
        events.append(self._emit(f"response.{final['status']}", {"response": final}))
        return events

    def fail(self, message: str, status: int) -> list[str]:
        """An `error` event (the SDKs raise on it); no terminal event follows."""
        error = {"type": "gateway_error", "code": str(status), "message": message}
        return [self._emit("error", {"code": str(status), "message": message, "param": None, "error": error})]
