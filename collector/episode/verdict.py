"""What a turn is, before anything acts on it: steps 1-3 of the episode loop's check order.

The episode loop (`collector.episode.loop`) and the harness gateway (`collector.harness`)
both ask the same questions of every turn, in the same order: is the reply over the loop's
limits (a `ProtocolViolation`, step 1), was it cut by the output cap (step 2), are its calls
malformed, unparsed or invisible (step 3), and does the fault end the episode under
`stop_on` and `max_consecutive_faults`. The answer is a `Verdict`; what each caller then does
with a turn that may not run differs (the loop settles the calls with "not executed"
results, the gateway withholds them from the harness), the classification does not.

Tests: tests/episode/test_loop.py (the loop's order), tests/harness/test_gateway_chat.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum

from collector.config import LoopConfig
from collector.record.episode import TurnRecord
from collector.stop import StopReason
from collector.turn import ToolCall, Turn

__all__ = ["Fault", "FaultStreak", "Verdict", "classify_turn", "over_limits"]


class Fault(StrEnum):
    """What is wrong with a turn, by the step of the check order that caught it."""

    NONE = "none"
    CUT = "cut"
    """Step 2: cut by the output cap (any length signal); nothing from it may run."""
    MALFORMED = "malformed"
    """Step 3: a malformed call, or no call with an unparsed one in the text, or invisible output."""


@dataclass(slots=True)
class FaultStreak:
    """Consecutive cut and malformed turns so far (`loop.max_consecutive_faults`)."""

    cut: int = 0
    bad: int = 0


@dataclass(slots=True, frozen=True)
class Verdict:
    fault: Fault
    ends: StopReason | None
    """The episode ends at this turn with this reason (`length`, `malformed_tool_call`); None: it goes on."""
    cut_answer: bool = False
    """A cut turn with no call at all, nor one left unparsed in its text (a cut final answer)."""


def over_limits(turn: Turn, settings: LoopConfig) -> str | None:
    """Why `turn` exceeds the loop's reply limits (step 1 of the check order), or None."""
    calls = turn.tool_calls
    if len(calls) > settings.max_tool_calls_per_turn:
        return f"{len(calls)} tool calls in one turn, over loop.max_tool_calls_per_turn = " + str(
            settings.max_tool_calls_per_turn
        )
    limit = settings.max_argument_bytes
    for call in calls:
        if call.raw_arguments is not None:
            size = len(call.raw_arguments.encode("utf-8", "replace"))
        else:
            raw = call.raw_object if call.raw_object is not None else call.arguments
            size = len(json.dumps(raw, separators=(",", ":")).encode("utf-8", "replace"))
        if size > limit:
            return f"a tool call's arguments are {size} bytes, over loop.max_argument_bytes = {limit}"
    return None


def classify_turn(
    turn: Turn, record: TurnRecord, calls: list[ToolCall], settings: LoopConfig, streak: FaultStreak
) -> Verdict:
    """Steps 2 and 3 for a recorded turn (`calls`: its calls, repeated ids renamed); updates `streak`."""
    stop_on = settings.stop_on
    max_faults = settings.max_consecutive_faults
    if turn.is_length:  # 2
        streak.cut += 1
        streak.bad = 0
        cut_answer = not calls and not record.unparsed_tool_call
        ending = (
            StopReason.LENGTH in stop_on
            or streak.cut >= max_faults
            or (cut_answer and not settings.retry_cut_answers)
        )
        return Verdict(Fault.CUT, StopReason.LENGTH if ending else None, cut_answer)
    streak.cut = 0
    invisible = record.invisible_output
    if record.malformed_calls or ((record.unparsed_tool_call or invisible) and not calls):  # 3
        streak.bad += 1
        if StopReason.MALFORMED_TOOL_CALL in stop_on or streak.bad >= max_faults:
            return Verdict(Fault.MALFORMED, StopReason.MALFORMED_TOOL_CALL)
        return Verdict(Fault.MALFORMED, None)
    streak.bad = 0
    return Verdict(Fault.NONE, None)
