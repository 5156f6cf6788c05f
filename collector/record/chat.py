"""The chat-template view of a transcript: the `system_prompt`, `chat` and `tools` columns.

The audit column `messages` says what happened (text with unparsed blocks marked, call
statuses, lengths of fragments that did not parse); a trainer's tokenizer wants something
else: the OpenAI chat shape every chat template consumes, ``{role, content, tool_calls:
[{id, type: "function", function: {name, arguments}}], tool_call_id, name}``, and the tool
schemas offered, ``[{type: "function", function: {name, description, parameters}}]``.
`chat` is built from `messages` at the end of the episode, one message for one message, so
``chat[i]`` and ``messages[i]`` describe the same message (``messages[i].turn_index`` maps it
to its turn).

What a cut or malformed turn looks like. Nothing from it was executed, but it is part of
what the model produced and of what it was shown afterwards, so `chat` keeps it as it was
replayed to the provider: the assistant message with its text and calls, then one `tool`
message per call holding the settling error result (``not executed: cut by the
output-token limit`` and the like). A malformed call's arguments are ``"{}"``, exactly what
the adapters replayed (the fragment itself is never stored); a tool-call block the server
left unparsed in the text keeps its opener plus ``[unparsed tool-call block: N chars]``. An
assistant turn with neither text nor a call (never sent back to the model) is kept with
empty content. A trainer that must not learn from such a turn masks it by
``turns[turn_index].discarded`` or drops the episode by `stop_reason`; the transcript
itself stays faithful.

`arguments` is a JSON *string*, as the OpenAI API and its fine-tuning format take it. Many
Hugging Face templates (Qwen2.5, Llama 3.x) apply ``tojson`` to it and want an object:
`template_messages(chat, parse_arguments=True)` gives them that.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from collector.record.episode import ChatFunction, ChatMessage, ChatToolCall, MessageRecord
from collector.turn import ToolSpec

__all__ = ["chat_messages", "system_prompt", "template_messages", "template_tools", "tools_json"]

#: What a call whose arguments did not parse carries, as the adapters replay it.
MALFORMED_ARGUMENTS = "{}"


def chat_messages(records: Sequence[MessageRecord]) -> list[ChatMessage]:
    """`messages` in the OpenAI chat shape, one for one (see the module docstring)."""
    out = []
    for m in records:
        if m.role == "assistant":
            calls = [
                ChatToolCall(c.id, "function", ChatFunction(c.name, c.arguments_json or MALFORMED_ARGUMENTS))
                for c in m.tool_calls
            ]
            out.append(ChatMessage("assistant", m.text, calls))
        elif m.role == "tool":
            out.append(ChatMessage("tool", m.text, tool_call_id=m.call_id, name=m.name))
        else:
            out.append(ChatMessage(m.role, m.text))
    return out


def system_prompt(records: Sequence[MessageRecord]) -> str | None:
    """The text of the system message the transcript starts with, or None."""
    return records[0].text if records and records[0].role == "system" else None


def tools_json(specs: Sequence[ToolSpec]) -> str:
    """The tools offered, as the JSON list of the OpenAI function format."""
    return json.dumps([
        {"type": "function",
         "function": {"name": s.name, "description": s.description, "parameters": s.parameters}}
        for s in specs
    ])


def template_messages(chat: Sequence[Mapping[str, Any]], *, parse_arguments: bool = False
                      ) -> list[dict[str, Any]]:
    """Stored `chat` rows (as any reader returns them) as messages a chat template takes.

    Keys that are null or empty for the message's role are dropped (`tool_calls` on a user
    message, `tool_call_id` on an assistant one), which the OpenAI fine-tuning format
    requires and every template tolerates. With `parse_arguments`, each call's arguments
    become an object, for templates that ``tojson`` them.
    """
    out = []
    for m in chat:
        msg: dict[str, Any] = {"role": m["role"], "content": m["content"]}
        if m.get("tool_calls"):
            msg["tool_calls"] = [
                {"id": c["id"], "type": c["type"],
                 "function": {"name": c["function"]["name"],
                              "arguments": json.loads(c["function"]["arguments"]) if parse_arguments
                              else c["function"]["arguments"]}}
                for c in m["tool_calls"]
            ]
        for key in ("tool_call_id", "name"):
            if m.get(key) is not None:
                msg[key] = m[key]
        out.append(msg)
    return out


def template_tools(tools: str) -> list[dict[str, Any]]:
    """The `tools` column's JSON as the list `apply_chat_template(..., tools=)` takes."""
    parsed: list[dict[str, Any]] = json.loads(tools)
    return parsed
