"""The gateway's OpenAI Chat Completions route: a harness's request in, the enforced turn out.

Inbound, a `/v1/chat/completions` body becomes a `HarnessRequest`: the conversation in the
provider-neutral `collector.turn` messages (system/developer, user, assistant with its calls,
tool results), the tools as `ToolSpec`s, the cap the harness asked for and whether it wants
a stream. Only what a turn needs is read; a body the gateway cannot read is a `BadRequest`
naming the field (a 400 in OpenAI's error shape).

Outbound, the `GatewayTurn` the session decided on is rendered as a `chat.completion`: the
turn's text, the calls returned to the harness (none when they were withheld) and the finish
reason the session chose (`length` for a withheld turn: the wire's own truncation signal).
The assistant message goes through the Chat adapter's own `chat_messages`, so a call is
replayed to the harness exactly as the collector would replay it to a server. Streamed,
`ChatStream` writes the chunks as the turn comes (`collector.harness.stream`).

Tests: tests/harness/test_gateway_chat.py, tests/harness/test_stream.py.
"""

from __future__ import annotations

import json
import time
from typing import Any

from collector.harness.request import BadRequest, GatewayTurn, HarnessRequest, non_empty_list, text_of
from collector.providers.chat import chat_messages
from collector.providers.common import call_from_text
from collector.turn import (
    AssistantMessage,
    JSONObject,
    Message,
    SystemMessage,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)

__all__ = ["ChatStream", "parse_chat_request", "render_chat_completion"]


def parse_chat_request(body: dict[str, Any]) -> HarnessRequest:
    """The harness's Chat Completions body as a `HarnessRequest` (see the module docstring)."""
    raw_messages = non_empty_list(body, "messages")
    messages: list[Message] = []
    names: dict[str, str] = {}  # call id -> tool name, for the tool results that follow
    for i, m in enumerate(raw_messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}]: must be an object")
        role = m.get("role")
        if role in ("system", "developer"):
            messages.append(SystemMessage(text_of(m.get("content"), f"messages[{i}].content")))
        elif role == "user":
            messages.append(UserMessage(text_of(m.get("content"), f"messages[{i}].content")))
        elif role == "assistant":
            calls = []
            for j, c in enumerate(m.get("tool_calls") or []):
                function = c.get("function") if isinstance(c, dict) else None
                if not isinstance(function, dict) or not isinstance(c.get("id"), str):
                    raise BadRequest(f"messages[{i}].tool_calls[{j}]: needs an id and a function")
                call = call_from_text(c["id"], function.get("name", ""), function.get("arguments", ""))
                names[call.id] = call.name
                calls.append(call)
            messages.append(AssistantMessage(text_of(m.get("content"), f"messages[{i}].content"), calls))
        elif role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str):
                raise BadRequest(f"messages[{i}].tool_call_id: must be a string")
            content = text_of(m.get("content"), f"messages[{i}].content")
            messages.append(ToolResultMessage(call_id, names.get(call_id, ""), content))
        else:
            raise BadRequest(f"messages[{i}].role: {str(role)[:32]!r} is not one of system, developer, "
                             "user, assistant, tool")
    tools: list[ToolSpec] = []
    for i, t in enumerate(body.get("tools") or []):
        function = t.get("function") if isinstance(t, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(f"tools[{i}]: needs a function with a name")
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        tools.append(ToolSpec(function["name"], str(function.get("description") or ""), parameters))
    asked = body.get("max_completion_tokens", body.get("max_tokens"))
    if asked is not None and (not isinstance(asked, int) or isinstance(asked, bool)):
        raise BadRequest("max_completion_tokens: must be an integer")
    options = body.get("stream_options")
    usage = isinstance(options, dict) and bool(options.get("include_usage"))
    model = str(body.get("model") or "")
    return HarnessRequest(messages, tools, asked, bool(body.get("stream")), model, usage)


def render_chat_completion(turn: GatewayTurn, model: str) -> JSONObject:
    """The `chat.completion` object the harness receives for `turn`."""
    message = chat_messages([AssistantMessage(turn.text, list(turn.returned))])[0]
    usage = turn.usage
    return {
        "id": turn.response_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": turn.finish_reason, "logprobs": None}],
        "usage": {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
    }


def _chunk(base: JSONObject, delta: JSONObject, finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
    return "data: " + json.dumps({**base, "choices": [choice]}, separators=(",", ":")) + "\n\n"


class ChatStream:
    """The `chat.completion.chunk` events of one streamed reply (`collector.harness.stream`).

    The text and reasoning (`reasoning_content`, as vLLM and DeepSeek stream it) as they come;
    at the end the returned calls (each whole, in one delta: none of a withheld turn), the
    finish reason, the usage when the harness asked for it (`stream_options`), `[DONE]`."""

    def __init__(self, response_id: str, model: str, include_usage: bool) -> None:
        self.base: JSONObject = {"id": response_id, "object": "chat.completion.chunk",
                                 "created": int(time.time()), "model": model}
        self.include_usage = include_usage

    def start(self) -> list[str]:
        return [_chunk(self.base, {"role": "assistant", "content": ""})]

    def text(self, delta: str) -> list[str]:
        return [_chunk(self.base, {"content": delta})]

    def reasoning(self, delta: str) -> list[str]:
        return [_chunk(self.base, {"reasoning_content": delta})]

    def finish(self, turn: GatewayTurn) -> list[str]:
        events = []
        if turn.returned:
            message = chat_messages([AssistantMessage("", list(turn.returned))])[0]
            calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
            events.append(_chunk(self.base, {"tool_calls": calls}))
        events.append(_chunk(self.base, {}, turn.finish_reason))
        if self.include_usage:
            usage = {"prompt_tokens": turn.usage.input_tokens, "completion_tokens": turn.usage.output_tokens,
                     "total_tokens": turn.usage.input_tokens + turn.usage.output_tokens}
            events.append("data: " + json.dumps({**self.base, "choices": [], "usage": usage},
                                                separators=(",", ":")) + "\n\n")
        events.append("data: [DONE]\n\n")
        return events

    def fail(self, message: str, status: int) -> list[str]:
        """An error chunk (the SDKs raise on a chunk with an `error`), and no `[DONE]`."""
        error = {"message": message, "type": "gateway_error", "code": status}
        return ["data: " + json.dumps({"error": error}, separators=(",", ":")) + "\n\n"]
