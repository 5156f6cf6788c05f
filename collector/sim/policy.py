"""The simulated policy: what the model *means* to do next, whatever the wire format.

It really works the built-in environments' tasks (the shared prompt spec in issue 3): it
finds the last user message that matches one of the task templates (a shell task's bash
commands are planned by `collector.sim.shell`), looks at the calls made
since then and their results, and either calls the tools that are still needed or answers
from the results. A result that reads as an error (the collector's "not executed" or
"arguments were malformed" results, Anthropic `is_error`, Gemini `{"error": ...}`) does not
count, so the call is issued again: that is how a model recovers.

The simulator never imports `collector.envs`: the templates below are the contract. A
prompt that matches none is played by `collector.sim.explore`: every offered tool is called
with arguments valid for its JSON Schema, then the model answers with the results (with no
tools offered, it answers in text).

Tests: tests/sim/test_faults_policy.py, tests/sim/test_truth.py, tests/sim/test_explore.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from collector.sim.explore import explore
from collector.sim.plans import MAX_ATTEMPTS, HistoryItem, Plan, PlannedCall, tally
from collector.sim.shell import TEMPLATE as SHELL_TEMPLATE
from collector.sim.shell import shell_plan

__all__ = ["MAX_ATTEMPTS", "HistoryItem", "Plan", "PlannedCall", "decide"]

_TEMPLATES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("arithmetic", re.compile(
        r"What is (?P<expr>[0-9][0-9+\-* ]*[0-9])\? "
        r"Use the calculator tool, then reply with the number only\.")),
    ("refund", re.compile(
        r"Order (?P<order_id>\S+) for customer (?P<customer_id>\S+) arrived damaged\. "
        r"Refund the full amount of (?P<amount>\d+) dollars\.")),
    ("close", re.compile(
        r"Customer (?P<customer_id>\S+) wants every ticket older than (?P<days>\d+) days closed\.")),
    ("email", re.compile(
        r'Email (?P<to>\S+) with the subject "(?P<subject>[^"]*)" and this body: (?P<body>.+?)\s*\Z', re.S)),
    ("approval", re.compile(
        r"Order (?P<order_id>\S+) for customer (?P<customer_id>\S+) needs a refund of (?P<amount>\d+) "
        r"dollars; refunds over 500 need approval first\.")),
    ("lookup", re.compile(r"What is the status of order (?P<order_id>[^\s?]+)\?")),
    ("shell", SHELL_TEMPLATE),  # bash commands through a coding harness's tool (collector.sim.shell)
)

def _needed_calls(task: str, m: re.Match[str]) -> tuple[PlannedCall, ...]:
    g = m.groupdict()
    if task == "arithmetic":
        return (PlannedCall("calculator", (("expression", g["expr"]),)),)
    if task == "refund":
        return (PlannedCall("refund", (("order_id", g["order_id"]), ("amount", int(g["amount"])))),)
    if task == "close":
        return (PlannedCall("close_tickets", (
            ("customer_id", g["customer_id"]), ("older_than_days", int(g["days"])))),)
    if task == "email":
        return (PlannedCall("send_email", (
            ("to", g["to"]), ("subject", g["subject"]), ("body", g["body"]))),)
    if task == "approval":
        return (
            PlannedCall("request_approval", (
                ("action", "refund"), ("order_id", g["order_id"]), ("reason", "refund over 500"))),
            PlannedCall("refund", (("order_id", g["order_id"]), ("amount", int(g["amount"])))),
        )
    return (PlannedCall("lookup_order", (("order_id", g["order_id"]),)),)


def _status_of(text: str) -> str:
    try:
        obj = json.loads(text)
    except ValueError:
        return text.strip()
    if isinstance(obj, dict):
        for key in ("status", "output", "result"):
            value = obj.get(key)
            if isinstance(value, str):
                return value
    return text.strip()


def _answer(task: str, m: re.Match[str], results: dict[str, str]) -> str:
    g = m.groupdict()
    if task == "arithmetic":
        return _status_of(results["calculator"])
    if task == "refund":
        return f"Refunded {g['amount']} dollars on order {g['order_id']}."
    if task == "close":
        return f"Closed the tickets of customer {g['customer_id']} older than {g['days']} days."
    if task == "email":
        return f"Sent the email to {g['to']}."
    if task == "approval":
        return f"Approval requested and {g['amount']} dollars refunded on order {g['order_id']}."
    return f"Order {g['order_id']} is {_status_of(results['lookup_order'])}."


def decide(history: list[HistoryItem], tools: frozenset[str],
           schemas: Mapping[str, Mapping[str, Any]] | None = None) -> Plan:
    """The next move given the conversation so far and the names of the offered tools
    (`schemas`: each offered tool's parameters schema, in the order offered, when the wire
    carries them)."""
    start = -1
    task = "none"
    match: re.Match[str] | None = None
    for i in range(len(history) - 1, -1, -1):
        item = history[i]
        if item[0] != "user":
            continue
        for name, pattern in _TEMPLATES:
            found = pattern.search(item[1])
            if found:
                start, task, match = i, name, found
                break
        if match is not None:
            break
    if match is None:
        return explore(history, tools, schemas)
    if task == "shell":
        return shell_plan(match, history[start][1], history[start + 1:], tools)
    needed = _needed_calls(task, match)
    if any(c.name not in tools for c in needed):
        return Plan(answer="I do not have the tools this request needs.", task=task)
    ok, attempts = tally(history[start + 1:])
    pending = tuple(c for c in needed if c.name not in ok)
    if not pending:
        return Plan(answer=_answer(task, match, ok), task=task)
    if any(attempts.get(c.name, 0) >= MAX_ATTEMPTS for c in pending):
        return Plan(answer="I could not complete the request.", task=task)
    return Plan(calls=pending, task=task)
