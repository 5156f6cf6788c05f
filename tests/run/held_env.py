"""`arithmetic` where all but the first few episodes of a worker wait at a gate in the calculator.

A progress test needs episodes finished while no batch can return (every batch holds a
held episode) and nothing is committed: the first `free` worlds a worker process starts
answer at once, every later one waits until `gate_dir/open` exists (at most `hold_s`).
The test opens the gate once it has seen what it waits for: no timing guess.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from collector.envs.arithmetic import ArithmeticEnv, ArithmeticWorld
from collector.envs.base import EpisodeContext, EpisodeWorld, Task, Tool
from collector.envs.toolkit import tool

OPEN = "open"


class HeldWorld(EpisodeWorld):
    """An arithmetic episode whose calculator waits for the gate."""

    def __init__(self, inner: ArithmeticWorld, gate: Path, hold_s: float) -> None:
        self._inner, self._gate, self._hold_s = inner, gate, hold_s
        self._tools = (tool(self.calculator),)

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    async def calculator(self, expression: str) -> str:
        """Evaluate an integer arithmetic expression (+, -, *, parentheses) and return its value."""
        loop = asyncio.get_running_loop()
        until = loop.time() + self._hold_s
        # The gate is opened by the test process: a file is the signal, so it is polled.
        while not self._gate.exists() and loop.time() < until:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        return self._inner.calculator(expression)

    def grade(self, final_text: str | None) -> float:
        return self._inner.grade(final_text)


class HeldArithmetic(ArithmeticEnv):
    """The arithmetic tasks; options `gate_dir` (required), `free`, `hold_s`, arithmetic's own."""

    name = "held_arithmetic"

    def __init__(self, gate_dir: str, free: int = 3, hold_s: float = 120.0, num_tasks: int = 100) -> None:
        super().__init__(num_tasks)
        self._gate = Path(gate_dir) / OPEN
        self._free_left = free
        self._hold_s = hold_s

    def start(self, task: Task, context: EpisodeContext | None = None) -> ArithmeticWorld | HeldWorld:
        world = super().start(task, context)
        if self._free_left > 0:
            self._free_left -= 1
            return world
        return HeldWorld(world, self._gate, self._hold_s)


def open_gate(gate_dir: Path) -> None:
    (gate_dir / OPEN).touch()
