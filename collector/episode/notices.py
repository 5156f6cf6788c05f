"""What the model is told about calls that did not run, and the notices the loop adds.

Each call of a turn is settled with exactly one result (`collector.episode.loop`'s module
docstring); these are the results of the calls that were not run and the user notices that
follow a turn with nothing to run. The model reads them; the simulator keys its recovery on
"not executed", so every result of a call that did not run starts with it.

Tests: tests/episode/test_loop.py, tests/episode/test_invisible.py, tests/episode/test_limits.py
"""

from __future__ import annotations

from collector.turn import ToolCall

__all__ = [
    "CUT", "CUT_RETRY", "CUT_TEXT_NOTICE", "ENV_FAILED", "INVISIBLE_NOTICE", "MALFORMED_END", "SIBLING_END",
    "TIMED_OUT", "UNPARSED_NOTICE", "duplicate", "held", "malformed",
]  # fmt: skip

CUT = "not executed: cut by the output-token limit"
CUT_RETRY = CUT + "; send the call again with shorter arguments"
CUT_TEXT_NOTICE = "Your last reply was cut by the output-token limit. Reply again, more briefly."
INVISIBLE_NOTICE = (
    "Your last reply arrived empty, though it used output tokens; nothing was run. "
    "If you meant to call a tool, send the call again; otherwise give your answer as text."
)
UNPARSED_NOTICE = (
    "Your last reply held a tool call written as text that could not be read; nothing was run. "
    "Send it again as a tool call with a complete JSON object."
)
MALFORMED_END = "not executed: the arguments were not a valid JSON object; the episode ended at this turn"
SIBLING_END = "not executed: another call of this turn had malformed arguments; the episode ended"
TIMED_OUT = "not executed: the episode's time limit expired"
ENV_FAILED = "not executed: the environment failed; the episode ended"


def duplicate(original: str) -> str:
    return (
        f"not executed: this call repeated the id {original[:64]!r} of an earlier call of this turn; "
        "send it again as a call of its own"
    )


def malformed(call: ToolCall) -> str:
    size = len(call.raw_arguments) if call.raw_arguments is not None else 0
    return (
        f"not executed: the arguments of this {call.name} call were not a valid JSON object "
        f"({size} characters received); send the call again with complete JSON arguments"
    )


def held(gate: str) -> str:
    return (
        f"not executed: the {gate} call of this turn did not go through, so nothing was approved; "
        f"send the {gate} request again, then this call"
    )

