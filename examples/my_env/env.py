"""A tiny shop: price an order line (quantity x unit price + shipping) with a calculator."""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import BaseModel, Field

from collector.envs.arithmetic import evaluate
from collector.envs.base import Environment, EpisodeWorld, Task, Tool
from collector.tools import tool

PROMPT = "What is {qty} * {price} + {shipping}? Use the calculator tool, then reply with the number only."


class CalculatorArgs(BaseModel):
    """Arguments of the calculator; field descriptions and constraints go into the schema."""

    expression: str = Field(max_length=100, pattern=r"^[0-9+\-* ()]+$", description="e.g. 3 * 25 + 10")


class UnitPricesWorld(EpisodeWorld):
    """One episode's state: the expected total and what the calculator was asked."""

    def __init__(self, expected: int, unit_prices: dict[str, int]) -> None:
        self.expected = expected
        self.unit_prices = unit_prices
        self.asked: list[str] = []
        self._tools = (
            tool(self.calculator, inline=True),
            tool(self.price_of, inline=True),
        )

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    def calculator(self, args: CalculatorArgs) -> str:
        """Evaluate an arithmetic expression with integers, + - * and parentheses."""
        self.asked.append(args.expression)
        # Never eval(): the built-in evaluator walks the parsed expression with bounded values.
        return str(evaluate(args.expression))

    def price_of(self, item: str) -> int:
        """The unit price of an item in dollars."""
        if item not in self.unit_prices:
            raise KeyError(f"unknown item {item[:40]}")
        return self.unit_prices[item]

    def grade(self, final_text: str | None) -> float:
        numbers = [w.strip(".$") for w in (final_text or "").split()]
        values = [int(n) for n in numbers if n.lstrip("-").isdigit()]
        return 1.0 if values and values[-1] == self.expected else 0.0


class UnitPricesEnv(Environment):
    """Generated order lines; options: `num_tasks`, `seed`."""

    name = "unit_prices"

    def __init__(self, num_tasks: int = 20, seed: int = 0) -> None:
        rng = random.Random(seed)
        self._tasks = []
        for i in range(num_tasks):
            qty, price, shipping = rng.randint(1, 9), rng.randint(5, 99), rng.choice((0, 5, 10))
            prompt = PROMPT.format(qty=qty, price=price, shipping=shipping)
            metadata = {"qty": qty, "price": price, "shipping": shipping}
            self._tasks.append(Task(f"line-{i:03d}", prompt, metadata))

    def tasks(self) -> Sequence[Task]:
        return self._tasks

    def start(self, task: Task) -> UnitPricesWorld:
        m = task.metadata
        return UnitPricesWorld(m["qty"] * m["price"] + m["shipping"], {"widget": m["price"]})
