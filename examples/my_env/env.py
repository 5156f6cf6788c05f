"""A tiny shop: price an order line (quantity x unit price + shipping) with a calculator.

What a plug-in environment for an outside harness needs, through the public interface only:

- `start(task, context)` gets the `EpisodeContext` (episode id, run id, model, provider,
  budget, sample, seed): here the world keeps it, and every audit line names the model;
- a tool schema given as data (`tools.json`, as datasets ship them), validated with
  `jsonschema` before the function runs: `tool(fn, parameters=spec["parameters"], ...)`;
- a tool that declares a `ToolCallContext` parameter gets its call id and turn index, so the
  audit log (`audit_path`, JSON lines) joins `executed_tool_calls` on (episode_id, call_id).
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from collector.envs.arithmetic import evaluate
from collector.envs.base import Environment, EpisodeContext, EpisodeWorld, Task, Tool, ToolCallContext
from collector.tools import tool

PROMPT = "What is {qty} * {price} + {shipping}? Use the calculator tool, then reply with the number only."
#: Tool schemas as data, the way a dataset ships them.
TOOL_SPECS: dict[str, dict[str, Any]] = {
    spec["name"]: spec for spec in json.loads(Path(__file__).with_name("tools.json").read_text())
}


class CalculatorArgs(BaseModel):
    """Arguments of the calculator; field descriptions and constraints go into the schema."""

    expression: str = Field(max_length=100, pattern=r"^[0-9+\-* ()]+$", description="e.g. 3 * 25 + 10")


class AuditLog:
    """Every tool call, one JSON line each (to a file when given a path), keyed like the shards."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.lines: list[dict[str, Any]] = []
        self._lock = threading.Lock()  # plain tools may run on tool threads

    def write(self, call: ToolCallContext, tool_name: str, **fields: Any) -> None:
        line = {
            "episode_id": call.episode.episode_id,
            "call_id": call.call_id,
            "turn": call.turn_index,
            "model": call.episode.model,
            "tool": tool_name,
            **fields,
        }
        with self._lock:
            self.lines.append(line)
            if self.path is not None:
                with open(self.path, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(line) + "\n")


class UnitPricesWorld(EpisodeWorld):
    """One episode's state: the expected total, what the calculator was asked, its context."""

    def __init__(
        self, expected: int, unit_prices: dict[str, int], context: EpisodeContext | None, audit: AuditLog
    ) -> None:
        self.expected = expected
        self.unit_prices = unit_prices
        self.context = context
        self.audit = audit
        self.asked: list[str] = []
        price_spec = TOOL_SPECS["price_of"]
        self._tools = (
            tool(self.calculator, inline=True),
            tool(
                self.price_of,
                name=price_spec["name"],
                description=price_spec["description"],
                parameters=price_spec["parameters"],
                inline=True,
            ),
        )

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    def calculator(self, args: CalculatorArgs, call: ToolCallContext) -> str:
        """Evaluate an arithmetic expression with integers, + - * and parentheses."""
        self.asked.append(args.expression)
        self.audit.write(call, "calculator", expression=args.expression)
        # Never eval(): the built-in evaluator walks the parsed expression with bounded values.
        return str(evaluate(args.expression))

    def price_of(self, call: ToolCallContext, **arguments: Any) -> int:
        """Arguments arrive as keywords once they satisfy the schema from tools.json."""
        item = arguments["item"]
        self.audit.write(call, "price_of", item=item)
        if item not in self.unit_prices:
            raise KeyError(f"unknown item {item[:40]}")
        return self.unit_prices[item]

    def grade(self, final_text: str | None) -> float:
        numbers = [w.strip(".$") for w in (final_text or "").split()]
        values = [int(n) for n in numbers if n.lstrip("-").isdigit()]
        return 1.0 if values and values[-1] == self.expected else 0.0


class UnitPricesEnv(Environment):
    """Generated order lines; options: `num_tasks`, `seed`, `audit_path` (JSON lines)."""

    name = "unit_prices"

    def __init__(self, num_tasks: int = 20, seed: int = 0, audit_path: str | None = None) -> None:
        rng = random.Random(seed)
        self.audit = AuditLog(audit_path)
        self._tasks = []
        for i in range(num_tasks):
            qty, price, shipping = rng.randint(1, 9), rng.randint(5, 99), rng.choice((0, 5, 10))
            prompt = PROMPT.format(qty=qty, price=price, shipping=shipping)
            metadata = {"qty": qty, "price": price, "shipping": shipping}
            self._tasks.append(Task(f"line-{i:03d}", prompt, metadata))

    def tasks(self) -> Sequence[Task]:
        return self._tasks

    def start(self, task: Task, context: EpisodeContext | None = None) -> UnitPricesWorld:
        m = task.metadata
        expected = m["qty"] * m["price"] + m["shipping"]
        return UnitPricesWorld(expected, {"widget": m["price"]}, context, self.audit)
