"""What a simulated model means to do next: the plan types, and what the calls so far returned.

Shared by the template policy (`collector.sim.policy`) and the explorer
(`collector.sim.explore`). A result that reads as an error (the collector's "not executed"
or "arguments were malformed" results, Anthropic `is_error`, Gemini `{"error": ...}`) does
not count as the tool's answer, so the call is issued again: that is how a model recovers,
up to `MAX_ATTEMPTS` calls of one tool.

Tests: tests/sim/test_faults_policy.py, tests/sim/test_explore.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# A parsed conversation, neutral across the four wire formats:
#   ("user", text) | ("call", call_id, name, args_or_None) | ("result", call_id, name, text, is_error)
HistoryItem = tuple[Any, ...]

MAX_ATTEMPTS = 4
"""Calls of one tool after which the model gives up and answers (no infinite loops)."""

_ERROR_TEXT = re.compile(
    r"(?i)^\s*(error\b|not executed)|arguments were malformed|cut by the output-token limit")


@dataclass(frozen=True, slots=True)
class PlannedCall:
    name: str
    arguments: tuple[tuple[str, Any], ...]
    """Ordered members; the serializer keeps this order."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Either calls to make now (`calls` non-empty) or a final answer (`answer`)."""

    calls: tuple[PlannedCall, ...] = ()
    answer: str = ""
    task: str = "none"


def is_error_result(text: str, flagged: bool) -> bool:
    """The result reads as an error (or the wire flagged it): the tool has not answered yet."""
    if flagged or _ERROR_TEXT.search(text):
        return True
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError:
            return False
        return isinstance(obj, dict) and "error" in obj
    return False


def tally(since: list[HistoryItem]) -> tuple[dict[str, str], dict[str, int]]:
    """Of the calls and results since the task's user message: each tool's last good result,
    and how many times each tool was called."""
    ok: dict[str, str] = {}
    attempts: dict[str, int] = {}
    names_by_id: dict[str, str] = {}
    for item in since:
        if item[0] == "call":
            names_by_id[item[1]] = item[2]
            attempts[item[2]] = attempts.get(item[2], 0) + 1
        elif item[0] == "result":
            name = names_by_id.get(item[1]) or str(item[2])
            if not is_error_result(item[3], item[4]):
                ok[name] = item[3]
    return ok, attempts

