"""The gateway's Anthropic Messages route: a harness's `/v1/messages` request in, the enforced turn out.

Inbound, the body becomes a `HarnessRequest`: `system` (a string or text blocks), the
messages' text, `tool_use` and `tool_result` blocks (a user message's results come before its
text, as the API orders them), the tools' `input_schema`s, and `max_tokens` (recorded; the
cell's budget is what is sent). Thinking blocks a harness replays are not forwarded: the
upstream may be any wire, and its own reasoning items are the adapter's business.

Outbound, the `GatewayTurn` becomes a `message`: a text block, the returned calls as
`tool_use` blocks, and `stop_reason` `end_turn`, `tool_use` or `max_tokens` (the wire's own
truncation signal for a withheld turn). Streamed, the same blocks as Messages events
(`MessageStream`): the text as it comes, the `tool_use` blocks once the turn is classified
(`collector.harness.stream`): no `input_json_delta` of a withheld call is ever sent.

Tests: tests/harness/test_gateway_anthropic.py, tests/harness/test_stream.py.
"""

from __future__ import annotations

import json
from typing import Any

from collector.harness.request import (
    ERROR_KINDS,
    BadRequest,
    GatewayTurn,
    HarnessRequest,
    non_empty_list,
    text_of,
)
from collector.providers.common import call_from_object, replay_object
from collector.turn import (
    AssistantMessage,
    JSONObject,
    Message,
    SystemMessage,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)

__all__ = ["MessageStream", "parse_messages_request", "render_message"]

_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def _blocks(content: Any, where: str) -> list[JSONObject]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise BadRequest(f"{where}: must be a string or a list of content blocks")
    return content


def _user(blocks: list[JSONObject], names: dict[str, str], where: str) -> list[Message]:
    results: list[Message] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text":
            texts.append(text_of(block.get("text"), f"{where}[{j}].text"))
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise BadRequest(f"{where}[{j}].tool_use_id: must be a string")
            content = text_of(block.get("content"), f"{where}[{j}].content")
            results.append(ToolResultMessage(call_id, names.get(call_id, ""), content,
                                             bool(block.get("is_error"))))
        else:
            raise BadRequest(f"{where}[{j}].type: {str(kind)[:32]!r} is not supported (text, tool_result)")
    return results + ([UserMessage("".join(texts))] if texts else [])


def parse_messages_request(body: dict[str, Any]) -> HarnessRequest:
    """The harness's Messages body as a `HarnessRequest` (see the module docstring)."""
    raw = non_empty_list(body, "messages")
    messages: list[Message] = []
    system = body.get("system")
    if system:
        messages.append(SystemMessage(text_of(system, "system")))
    names: dict[str, str] = {}
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}]: must be an object")
        blocks = _blocks(m.get("content"), f"messages[{i}].content")
        if m.get("role") == "user":
            messages.extend(_user(blocks, names, f"messages[{i}].content"))
        elif m.get("role") == "assistant":
            text, calls = [], []
            for j, block in enumerate(blocks):
                kind = block.get("type")
                if kind == "text":
                    text.append(text_of(block.get("text"), f"messages[{i}].content[{j}].text"))
                elif kind == "tool_use":
                    if not isinstance(block.get("id"), str):
                        raise BadRequest(f"messages[{i}].content[{j}].id: must be a string")
                    call = call_from_object(block["id"], block.get("name", ""), block.get("input"))
                    names[call.id] = call.name
                    calls.append(call)
                elif kind not in ("thinking", "redacted_thinking"):
                    raise BadRequest(f"messages[{i}].content[{j}].type: {str(kind)[:32]!r} is not supported")
            messages.append(AssistantMessage("".join(text), calls))
        else:
            raise BadRequest(f"messages[{i}].role: {str(m.get('role'))[:32]!r} is not one of user, assistant")
    tools: list[ToolSpec] = []
    for i, t in enumerate(body.get("tools") or []):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or "input_schema" not in t:
            raise BadRequest(f"tools[{i}]: only custom tools (name, input_schema) are supported")
        tools.append(ToolSpec(t["name"], str(t.get("description") or ""), t["input_schema"]))
    asked = body.get("max_tokens")
    if not isinstance(asked, int) or isinstance(asked, bool):
        raise BadRequest("max_tokens: required, an integer")
    return HarnessRequest(messages, tools, asked, bool(body.get("stream")), str(body.get("model") or ""))


def _content(turn: GatewayTurn) -> list[JSONObject]:
    blocks: list[JSONObject] = [{"type": "text", "text": turn.text}] if turn.text else []
    for call in turn.returned:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": replay_object(call)})
    return blocks


def render_message(turn: GatewayTurn, model: str) -> JSONObject:
    """The `message` object the harness receives for `turn`."""
    return {
        "id": turn.response_id, "type": "message", "role": "assistant", "model": model,
        "content": _content(turn), "stop_reason": _STOP[turn.finish_reason], "stop_sequence": None,
        "usage": {"input_tokens": turn.usage.input_tokens, "output_tokens": turn.usage.output_tokens},
    }


def _event(kind: str, data: JSONObject) -> str:
    return f"event: {kind}\ndata: " + json.dumps({"type": kind, **data}, separators=(",", ":")) + "\n\n"


class MessageStream:
    """The Messages events of one streamed reply (`collector.harness.stream`).

    Text deltas in a `text` block and reasoning in a `thinking` block (with an empty
    signature: the gateway's upstream may be any wire, and a replayed thinking block is not
    forwarded), each closed when the other kind comes or the turn ends; the returned calls'
    `tool_use` blocks after the turn is classified (no `input_json_delta` of a withheld call
    is ever written); `message_delta` with the stop reason, `message_stop`."""

    def __init__(self, response_id: str, model: str) -> None:
        self.response_id, self.model = response_id, model
        self.index = 0
        """The index of the next content block."""
        self.open: str | None = None

    def start(self) -> list[str]:
        message: JSONObject = {
            "id": self.response_id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [_event("message_start", {"message": message})]

    def _close(self) -> list[str]:
        if self.open is None:
            return []
        events = []
        if self.open == "thinking":
            signature = {"type": "signature_delta", "signature": ""}
            events.append(_event("content_block_delta", {"index": self.index, "delta": signature}))
        events.append(_event("content_block_stop", {"index": self.index}))
        self.open = None
        self.index += 1
        return events

    def _delta(self, kind: str, delta: JSONObject) -> list[str]:
        events = []
        if self.open != kind:
            events = self._close()
            block = {"type": "text", "text": ""} if kind == "text" else {"type": "thinking", "thinking": "",
                                                                          "signature": ""}
            events.append(_event("content_block_start", {"index": self.index, "content_block": block}))
            self.open = kind
        events.append(_event("content_block_delta", {"index": self.index, "delta": delta}))
        return events

    def text(self, delta: str) -> list[str]:
        return self._delta("text", {"type": "text_delta", "text": delta})

    def reasoning(self, delta: str) -> list[str]:
        return self._delta("thinking", {"type": "thinking_delta", "thinking": delta})

    def finish(self, turn: GatewayTurn) -> list[str]:
        events = self._close()
        for call in turn.returned:
            opened = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            events.append(_event("content_block_start", {"index": self.index, "content_block": opened}))
            delta = {"type": "input_json_delta", "partial_json": json.dumps(replay_object(call))}
            events.append(_event("content_block_delta", {"index": self.index, "delta": delta}))
            events.append(_event("content_block_stop", {"index": self.index}))
            self.index += 1
        usage = {"input_tokens": turn.usage.input_tokens, "output_tokens": turn.usage.output_tokens}
        events.append(_event("message_delta", {"delta": {"stop_reason": _STOP[turn.finish_reason],
                                                         "stop_sequence": None}, "usage": usage}))
        events.append(_event("message_stop", {}))
        return events

    def fail(self, message: str, status: int) -> list[str]:
        """An `error` event (the SDKs raise on it); no `message_stop` follows."""
        kind = ERROR_KINDS.get(status, "api_error")
        return [_event("error", {"error": {"type": kind, "message": message}})]
