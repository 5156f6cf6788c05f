"""What every dialect's parser produces, and the strict checks they share.

Strict real backends refuse histories a lenient fake would let through, and a collector
tested only against a lenient fake ships those histories to production. The shared rules:

- every call must be settled by exactly one result before the next user or assistant turn
  (a call left without a result, or a result naming no pending call, is a 400);
- replayed arguments that are not valid JSON are a 500 on the string-argument dialects
  (Qwen behind vLLM re-parses the history and fails inside the server);
- the body must be a JSON object with the dialect's required fields and types (400).

Tests: tests/sim/test_validation.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from collector.sim.errors import SimError
from collector.sim.policy import HistoryItem
from collector.sim.presets import ModelPreset

DEFAULT_CAP = 8192
"""Output cap when a dialect lets the request omit it."""


@dataclass(slots=True)
class ParsedRequest:
    model: str
    history: list[HistoryItem]
    tools: frozenset[str]
    cap: int
    stream: bool
    include_usage: bool = False
    prompt_tokens: int = 0
    preset: ModelPreset | None = None
    """Set by the app once the model is known (token rendering needs its knobs)."""
    raw_messages: list[Any] | None = None
    """Chat only: the request's messages as sent, for rendering prompt token ids."""
    tool_names: tuple[str, ...] = ()
    """Chat only: the offered tools, in request order."""
    tool_schemas: dict[str, Any] = field(default_factory=dict)
    """Each offered tool's parameters schema, in request order (`collector.sim.explore` plays
    the tools of a request no template matches)."""
    return_token_ids: bool = False
    return_prompt_token_ids: bool = False
    logprobs: bool = False
    thinking_budget: int | None = None
    """Anthropic `thinking.budget_tokens` / Gemini `thinkingBudget`: the most a turn may think."""
    include_thoughts: bool = False
    """Gemini `includeThoughts` / Responses `include: ["reasoning.encrypted_content"]`."""
    short_assistant: str | None = None
    """Responses: the 400 llama-server gives an assistant item in the short form without
    `type`; applied only by a preset with `responses_server="llamacpp"`."""
    unreasoned: str | None = None
    """The dialect's 400 for a call replayed without its reasoning; applied only when the model
    thinks (`collector.sim.thinking`)."""


class CallLedger:
    """Tracks the calls of the latest assistant turn until each gets its one result."""

    __slots__ = ("names", "pending")

    def __init__(self) -> None:
        self.pending: list[str] = []
        self.names: dict[str, str] = {}

    def open(self, call_id: str, name: str) -> None:
        if call_id in self.pending:
            raise SimError(400, f"Duplicate tool call id {call_id!r} in one assistant turn.")
        self.pending.append(call_id)
        self.names[call_id] = name

    def settle(self, call_id: str) -> str:
        """Mark `call_id` answered; returns the call's name. 400 when no such call is pending."""
        if call_id not in self.pending:
            raise SimError(400, f"Tool result {call_id!r} does not answer any pending tool call of the "
                                "preceding assistant turn.")
        self.pending.remove(call_id)
        return self.names[call_id]

    def settle_by_name(self, name: str) -> str:
        """Gemini without ids: the first pending call of that name."""
        for call_id in self.pending:
            if self.names[call_id] == name:
                self.pending.remove(call_id)
                return call_id
        raise SimError(400, f"Function response {name!r} does not answer any function call of the "
                            "preceding model turn.")

    def close_turn(self) -> None:
        """A new user or assistant turn begins: every call must have its result by now."""
        if self.pending:
            raise SimError(400, "An assistant message with tool calls must be followed by a result for each "
                                f"call; these had none: {', '.join(self.pending)}.")


def check_json_arguments(arguments: object, where: str) -> dict[str, Any] | None:
    """Parse replayed string arguments as the backend's template would; 500 if it cannot."""
    if not isinstance(arguments, str):
        raise SimError(400, f"{where}: arguments must be a string.")
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError) as exc:
        # vLLM's chat template json-decodes replayed arguments and fails inside the server.
        raise SimError(500, f"{where}: the replayed tool-call arguments are not valid JSON.") from exc
    return value if isinstance(value, dict) else None


def require(obj: object, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """`obj[key]` if `obj` is a dict and the value has the expected type, else 400."""
    if not isinstance(obj, dict) or key not in obj:
        raise SimError(400, f"{where}: missing required field {key!r}.", param=key)
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise SimError(400, f"{where}: field {key!r} has the wrong type.", param=key)
    return value


def optional_cap(obj: dict[str, Any], *keys: str) -> int | None:
    """The first of `keys` present, as a non-negative integer cap; 400 when it is not one."""
    for key in keys:
        value = obj.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SimError(400, f"{key} must be a positive integer.", param=key)
        return value
    return None


def text_of(content: object, where: str) -> str:
    """The text of a string or a list of text parts (non-text parts are skipped)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out: list[str] = []
        for part in content:
            if not isinstance(part, dict):
                raise SimError(400, f"{where}: content parts must be objects.")
            text = part.get("text")
            if isinstance(text, str):
                out.append(text)
        return "".join(out)
    raise SimError(400, f"{where}: content must be a string or a list of parts.")
