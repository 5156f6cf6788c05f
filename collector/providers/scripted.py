"""A scripted provider: returns pre-built `Turn`s, for tests of the loop and of users' envs.

Shipped in the package (not hidden in tests) so that users can test their own environments
against exact model behaviour, including the faults that matter: a call cut by the output
cap, malformed arguments, a gate call gone wrong. No HTTP, no server, no key.

A script is a sequence of steps; each step is a `Turn` or a function of the `TurnRequest`
returning one (to react to tool results, or to honour the requested cap). Every request is
kept in `requests` so a test can assert what the loop sent. When the script runs out the
provider raises `ProviderUnavailable`, which the loop records as an `error` episode, so a
test that scripts too few turns fails visibly instead of hanging.

The helpers build turns the way the adapters do: `call` parses argument text strictly
(a non-object or broken text gives status MALFORMED with the text kept raw), `cut` marks a
turn as cut by the output cap.

Tests: tests/envs/test_my_env.py, tests/faults/test_bad_input.py.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from typing import Any

from collector.errors import ProviderUnavailable
from collector.turn import ArgStatus, FinishClass, LengthSignal, ToolCall, Turn, TurnRequest, Usage

Step = Turn | Callable[[TurnRequest], Turn]


class ScriptedProvider:
    """A `Provider` whose turns come from a script (see the module docstring)."""

    kind = "scripted"

    def __init__(self, script: Iterable[Step]) -> None:
        self._script = list(script)
        self._next = 0
        self.requests: list[TurnRequest] = []

    @property
    def remaining(self) -> int:
        return len(self._script) - self._next

    async def complete(self, request: TurnRequest) -> Turn:
        # Snapshot the message list: the loop appends to its history after this call.
        self.requests.append(dataclasses.replace(request, messages=list(request.messages)))
        if self._next >= len(self._script):
            raise ProviderUnavailable("scripted provider: the script has no more turns")
        step = self._script[self._next]
        self._next += 1
        turn = step(request) if callable(step) else step
        # The cap on the turn is what was asked for, as with the real adapters.
        return dataclasses.replace(turn, max_output_tokens=request.max_output_tokens)


def call(name: str, arguments: dict[str, Any] | str, id: str | None = None) -> ToolCall:
    """A tool call; `arguments` as an object, or as raw text parsed strictly like the adapters."""
    call_id = id or f"call_{name}_{_counter()}"
    if isinstance(arguments, dict):
        return ToolCall(call_id, name, arguments, ArgStatus.OK, raw_arguments=json.dumps(arguments))
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return ToolCall(call_id, name, parsed, ArgStatus.OK, raw_arguments=arguments)
    return ToolCall(call_id, name, None, ArgStatus.MALFORMED, raw_arguments=arguments)


def text(content: str, output_tokens: int | None = None) -> Turn:
    """A final answer with no tool call."""
    return _turn(content, [], "stop", FinishClass.STOP, output_tokens)


def calls(*tool_calls: ToolCall, text: str = "", output_tokens: int | None = None) -> Turn:
    """A complete turn asking for the given tool calls."""
    return _turn(text, list(tool_calls), "tool_calls", FinishClass.TOOL_CALLS, output_tokens)


def cut(
    *tool_calls: ToolCall,
    text: str = "",
    output_tokens: int | None = None,
    signals: tuple[LengthSignal, ...] = (LengthSignal.FINISH_REASON,),
    raw_finish_reason: str = "length",
) -> Turn:
    """A turn cut by the output cap, with whatever calls it got out (maybe complete-looking)."""
    turn = _turn(text, list(tool_calls), raw_finish_reason, FinishClass.LENGTH, output_tokens)
    turn.length_signals = signals
    return turn


def leaked(text: str, output_tokens: int | None = None) -> Turn:
    """A turn whose tool call stayed in the text as a chat-template block nobody parsed."""
    turn = _turn(text, [], "stop", FinishClass.STOP, output_tokens)
    turn.unparsed_tool_call = True
    return turn


def _turn(
    content: str, tool_calls: list[ToolCall], raw: str, finish: FinishClass, output_tokens: int | None
) -> Turn:
    chars = len(content) + sum(len(c.raw_arguments or "") + len(c.name) for c in tool_calls)
    tokens = output_tokens if output_tokens is not None else max(1, chars // 4)
    return Turn(
        text=content,
        tool_calls=tool_calls,
        raw_finish_reason=raw,
        finish_class=finish,
        usage=Usage(input_tokens=0, output_tokens=tokens),
        max_output_tokens=0,
        latency_s=0.0,
    )


_ids = iter(range(1, 1 << 62))


def _counter() -> int:
    return next(_ids)
