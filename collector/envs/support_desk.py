"""`support_desk`: a customer-support world where a cut tool call does real damage.

Tests: tests/envs/test_builtin.py.

Built around the seeds' traps: `refund` takes an amount (a call cut at ``"amount": 10``
would refund 10 instead of 1000); `close_tickets` has ALL-OPTIONAL filters (its default
call closes every ticket of every customer); `request_approval` is a gate (a malformed
approval must hold the refund beside it). Grading reads the world's final state, so any
such slip costs the reward.

Tools (names and arguments shared with the simulator's policy):
``lookup_order(order_id: str)``, ``refund(order_id: str, amount: float)``,
``close_tickets(customer_id: str = "", older_than_days: int = 0)``,
``send_email(to: str, subject: str, body: str)``,
``request_approval(action: str, order_id: str, reason: str)`` (gate).

Task kinds and prompts (the simulator recognises these exact phrasings):
- refund: ``Order {order_id} for customer {customer_id} arrived damaged. Refund the full
  amount of {amount} dollars.``
- close: ``Customer {customer_id} wants every ticket older than {days} days closed.``
- email: ``Email {to} with the subject "{subject}" and this body: {body}``
- approval: ``Order {order_id} for customer {customer_id} needs a refund of {amount}
  dollars; refunds over 500 need approval first.``
- lookup: ``What is the status of order {order_id}?``

Grades are 1.0 or 0.0, from the final state: the task's own effect exactly (the refund
with exactly the right amount; exactly the customer's tickets older than the threshold;
the email with exact fields; for approval, an approval of that order before its refund)
and no other refund, closure or email. For lookup, the order's status word must appear in
the final answer.

Each world is built from the task's metadata (or, for tasks from a file without it, from
the prompt), with decoy orders, customers and tickets derived from the task id.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collector.envs.base import Environment, EpisodeContext, EpisodeWorld, Task, Tool, generated_task_count
from collector.envs.toolkit import tool
from collector.turn import UserMessage

KINDS = ("refund", "close", "email", "approval", "lookup")
STATUSES = ("processing", "shipped", "delivered", "returned", "cancelled")

PROMPTS: Mapping[str, str] = {
    "refund": "Order {order_id} for customer {customer_id} arrived damaged. "
    "Refund the full amount of {amount} dollars.",
    "close": "Customer {customer_id} wants every ticket older than {days} days closed.",
    "email": 'Email {to} with the subject "{subject}" and this body: {body}',
    "approval": "Order {order_id} for customer {customer_id} needs a refund of {amount} dollars; "
    "refunds over 500 need approval first.",
    "lookup": "What is the status of order {order_id}?",
}

_PATTERNS: Mapping[str, re.Pattern[str]] = {
    "refund": re.compile(
        r"Order (?P<order_id>\S+) for customer (?P<customer_id>\S+) arrived damaged\. "
        r"Refund the full amount of (?P<amount>\d+) dollars\."
    ),
    "close": re.compile(
        r"Customer (?P<customer_id>\S+) wants every ticket older than (?P<days>\d+) days closed\."
    ),
    "email": re.compile(
        r'Email (?P<to>\S+) with the subject "(?P<subject>[^"]*)" and this body: (?P<body>.+)\Z', re.S
    ),
    "approval": re.compile(
        r"Order (?P<order_id>\S+) for customer (?P<customer_id>\S+) needs a refund of (?P<amount>\d+) "
        r"dollars; refunds over 500 need approval first\."
    ),
    "lookup": re.compile(r"What is the status of order (?P<order_id>[^\s?]+)\?"),
}

_TEXT = (
    "thanks for your patience while we looked into the delay on your parcel and the carrier "
    "confirmed a new delivery window for this week we also added a credit to your account "
    "please reply to this message if anything else comes up and our team will follow up "
    "with you directly within one business day the replacement item ships from our north "
    "warehouse and tracking details will arrive in a separate note"
)
_WORDS = tuple(_TEXT.split(" "))
_NAMES = ("dana", "jordan", "li", "sam", "alex", "maria", "noor", "kai", "ines", "tomas")
_SUBJECTS = (
    "Your order update", "Replacement on the way", "Refund processed", "Delivery window", "Account credit",
)


@dataclass(slots=True)
class Ticket:
    id: str
    customer_id: str
    age_days: int
    open: bool = True


class SupportDeskWorld(EpisodeWorld):
    """One episode's orders, tickets, refunds, approvals and sent emails."""

    def __init__(self, kind: str, params: Mapping[str, Any], task_id: str) -> None:
        self.kind = kind
        self.params = params
        rng = random.Random(f"support_desk:{task_id}")
        self.orders: dict[str, dict[str, Any]] = {}
        self.tickets: list[Ticket] = []
        self.refunds: list[tuple[str, float]] = []
        self.approvals: list[tuple[str, str, int]] = []  # (action, order_id, event number)
        self.emails: list[tuple[str, str, str]] = []
        self.events = 0
        self.refund_events: list[int] = []
        self._build(rng)
        self._tools = (
            tool(self.lookup_order, inline=True),
            tool(self.refund, inline=True),
            tool(self.close_tickets, inline=True),
            tool(self.send_email, inline=True),
            tool(self.request_approval, inline=True, gate=True),
        )

    def _build(self, rng: random.Random) -> None:
        p = self.params
        customers = [f"C-{rng.randint(10, 99)}" for _ in range(3)]
        if "customer_id" in p:
            customers = [p["customer_id"], *[c for c in customers if c != p["customer_id"]]]
        for _ in range(3):  # decoy orders, then the task's own
            decoy = {"customer_id": rng.choice(customers), "amount": rng.randint(20, 900)}
            self.orders[f"A-{rng.randint(1000, 9999)}"] = {**decoy, "status": rng.choice(STATUSES)}
        if "order_id" in p:
            self.orders[p["order_id"]] = {
                "customer_id": p.get("customer_id", customers[0]),
                "amount": int(p.get("amount", rng.randint(20, 900))),
                "status": p.get("status", rng.choice(STATUSES)),
            }
        days = int(p.get("days", 30))
        for customer in customers:
            for _ in range(rng.randint(2, 4)):
                age = rng.choice((max(1, days - rng.randint(1, days or 1)), days + rng.randint(1, 60)))
                self.tickets.append(Ticket(f"T-{len(self.tickets) + 100}", customer, age))
        if "customer_id" in p:  # the target always has one ticket on each side of the threshold
            self.tickets.append(Ticket(f"T-{len(self.tickets) + 100}", p["customer_id"], days + 5))
            self.tickets.append(Ticket(f"T-{len(self.tickets) + 100}", p["customer_id"], max(1, days - 5)))

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    # --- tools ---

    def lookup_order(self, order_id: str) -> str:
        """Look up an order: its status, amount in dollars and customer."""
        order = self.orders.get(order_id)
        if order is None:
            raise LookupError(f"no order {order_id[:32]}")
        return json.dumps({"order_id": order_id, **order})

    def refund(self, order_id: str, amount: float) -> str:
        """Refund an amount in dollars on an order."""
        order = self.orders.get(order_id)
        if order is None:
            raise LookupError(f"no order {order_id[:32]}")
        if not 0 < amount <= order["amount"]:
            raise ValueError("the amount must be positive and at most the order total")
        self.events += 1
        self.refunds.append((order_id, float(amount)))
        self.refund_events.append(self.events)
        return f"refunded {amount:g} dollars on order {order_id}"

    def close_tickets(self, customer_id: str = "", older_than_days: int = 0) -> str:
        """Close open tickets. Filters are optional: with none, every open ticket is closed."""
        closed = 0
        for ticket in self.tickets:
            matches = not customer_id or ticket.customer_id == customer_id
            if ticket.open and matches and ticket.age_days > older_than_days:
                ticket.open = False
                closed += 1
        return f"closed {closed} tickets"

    def send_email(self, to: str, subject: str, body: str) -> str:
        """Send an email to a customer."""
        self.emails.append((to, subject, body))
        return f"email sent to {to}"

    def request_approval(self, action: str, order_id: str, reason: str) -> str:
        """Ask a supervisor to approve an action on an order (needed for refunds over 500)."""
        self.events += 1
        self.approvals.append((action, order_id, self.events))
        return "approved"

    # --- grading ---

    def grade(self, final_text: str | None) -> float:
        p = self.params
        closed = {t.id for t in self.tickets if not t.open}
        if self.kind == "lookup":
            status = self.orders[p["order_id"]]["status"]
            ok = not (self.refunds or closed or self.emails) and status in (final_text or "").lower()
        elif self.kind == "close":
            days = int(p["days"])
            expected = {t.id for t in self.tickets if t.customer_id == p["customer_id"] and t.age_days > days}
            ok = closed == expected and not self.refunds and not self.emails
        elif self.kind == "email":
            ok = self.emails == [(p["to"], p["subject"], p["body"])] and not self.refunds and not closed
        else:
            right = self.refunds == [(p["order_id"], float(p["amount"]))] and not closed and not self.emails
            if self.kind == "approval":
                approved_at = [e for a, o, e in self.approvals if a == "refund" and o == p["order_id"]]
                right = right and bool(approved_at) and min(approved_at) < self.refund_events[0]
            ok = right
        return 1.0 if ok else 0.0


class SupportDeskEnv(Environment):
    """Generated support tasks, the five kinds in turn; options: `num_tasks`, `seed`."""

    name = "support_desk"

    def __init__(self, num_tasks: int = 60, seed: int = 0) -> None:
        rng = random.Random(f"support_desk:{seed}")
        count = generated_task_count(num_tasks)
        self._tasks = [self._make(rng, i, KINDS[i % len(KINDS)]) for i in range(count)]

    @staticmethod
    def _make(rng: random.Random, index: int, kind: str) -> Task:
        params: dict[str, Any] = {"kind": kind}
        if kind in ("refund", "approval", "lookup"):
            params["order_id"] = f"A-{1000 + index}"
            params["customer_id"] = f"C-{rng.randint(10, 99)}"
        if kind == "refund":
            params["amount"] = rng.choice((rng.randint(20, 499), rng.randint(500, 1500)))
        elif kind == "approval":
            params["amount"] = rng.randint(501, 3000)
        elif kind == "lookup":
            params["status"] = rng.choice(STATUSES)
        elif kind == "close":
            params["customer_id"] = f"C-{rng.randint(10, 99)}"
            params["days"] = rng.choice((7, 14, 30, 60, 90))
        else:
            name = rng.choice(_NAMES)
            params["to"] = f"{name}.{rng.choice(_NAMES)}@example.com"
            params["subject"] = rng.choice(_SUBJECTS)
            target = rng.randint(100, 600)
            words: list[str] = []
            while sum(len(w) + 1 for w in words) < target:
                words.append(rng.choice(_WORDS))
            params["body"] = (" ".join(words)).capitalize()[:600].rstrip() + "."
        return Task(f"desk-{index:04d}-{kind}", PROMPTS[kind].format(**params), params)

    def tasks(self) -> Sequence[Task]:
        return self._tasks

    def start(self, task: Task, context: EpisodeContext | None = None) -> SupportDeskWorld:
        kind, params = _params(task)
        return SupportDeskWorld(kind, params, task.id)

    def check_task(self, task: Task) -> str | None:
        try:
            _params(task)
        except ValueError as exc:
            return str(exc)
        return None


def _params(task: Task) -> tuple[str, dict[str, Any]]:
    """The task's kind and parameters: from metadata, else parsed from the prompt."""
    kind = task.metadata.get("kind")
    if kind in KINDS and all(k in task.metadata for k in _PATTERNS[str(kind)].groupindex):
        return str(kind), dict(task.metadata)
    texts = [task.prompt] if isinstance(task.prompt, str) else [
        m.text for m in task.prompt if isinstance(m, UserMessage)
    ]
    for text in reversed(texts):
        for name, pattern in _PATTERNS.items():
            match = pattern.search(text)
            if match:
                params: dict[str, Any] = {**task.metadata, **match.groupdict(), "kind": name}
                for key in ("amount", "days"):
                    if key in params:
                        params[key] = int(params[key])
                return name, params
    raise ValueError("not a support_desk prompt and no usable metadata")
