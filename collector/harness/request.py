"""What the gateway's wire routes and its session exchange, whatever the harness's dialect.

A route parses its body into a `HarnessRequest`; the session (`collector.harness.session`)
answers with a `GatewayTurn`: the model's turn after the stop rules, with the calls split
into those returned to the harness and those withheld, and a dialect-neutral finish reason
(`stop`, `tool_calls`, `length`) that each route writes in its wire's own vocabulary.

Tests: tests/harness/test_gateway_chat.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from collector.turn import Message, ToolCall, ToolSpec, Usage

__all__ = [
    "ERROR_KINDS", "BadRequest", "Finish", "GatewayTurn", "HarnessRequest", "Refused", "non_empty_list",
    "text_of",
]


#: Error types by status: the same names in OpenAI's and Anthropic's error shapes.
ERROR_KINDS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error"}


class BadRequest(Exception):
    """The harness sent a body the gateway cannot read: a 400 naming the field."""


class Refused(Exception):
    """The token is unknown, or its episode has ended: nothing is forwarded."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class HarnessRequest:
    messages: list[Message]
    tools: list[ToolSpec]
    asked_cap: int | None
    """The output cap the harness asked for (recorded; the cell's budget is what is sent)."""
    stream: bool
    asked_model: str
    stream_usage: bool = False
    """A streamed reply ends with a usage event (Chat `stream_options.include_usage`)."""


Finish = Literal["stop", "tool_calls", "length"]


@dataclass(slots=True)
class GatewayTurn:
    """One turn as the harness receives it."""

    text: str
    returned: list[ToolCall]
    withheld: list[ToolCall]
    finish_reason: Finish
    usage: Usage
    response_id: str
    reasoning_items: list[dict[str, Any]] = field(default_factory=list)


def non_empty_list(body: dict[str, Any], field: str) -> list[Any]:
    """`body[field]`, which must be a non-empty list (a conversation)."""
    value = body.get(field)
    if not isinstance(value, list) or not value:
        raise BadRequest(f"{field}: must be a non-empty list")
    return value


def text_of(content: Any, where: str) -> str:
    """A message's content as text: a string, null, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(f"{where}: a content part of type {str(kind)[:32]!r} is not supported "
                                 "(text parts only)")
        return "".join(parts)
    raise BadRequest(f"{where}: must be a string or a list of text parts")
