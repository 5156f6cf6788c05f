"""`arithmetic` with a gate in its calculator: fault tests strike while work is provably in flight.

Every calculator call first creates `gate_dir/<pid>` (the pid of the worker process running
it: that process now holds an episode mid-turn), then waits until `gate_dir/open` exists
(at most `hold_s`), then answers as the plain calculator would. A test waits for a pid
file of the process it wants to hit, strikes (SIGSTOP, SIGKILL of its node), then creates
`open`: the run cannot finish before the fault has landed, however fast the machine is.
Load it as `env.name = "tests.faults.gated_env:GatedArithmetic"`, `options = {gate_dir = ...}`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

from collector.envs.arithmetic import ArithmeticEnv, ArithmeticWorld
from collector.envs.base import EpisodeWorld, Task, Tool
from collector.envs.toolkit import tool

OPEN = "open"


class GatedWorld(EpisodeWorld):
    """An arithmetic episode whose calculator waits at the gate."""

    def __init__(self, inner: ArithmeticWorld, gate_dir: Path, hold_s: float) -> None:
        self._inner = inner
        self._gate_dir = gate_dir
        self._hold_s = hold_s
        self._tools = (tool(self.calculator),)

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    async def calculator(self, expression: str) -> str:
        """Evaluate an integer arithmetic expression (+, -, *, parentheses) and return its value."""
        (self._gate_dir / str(os.getpid())).touch()
        loop = asyncio.get_running_loop()
        until = loop.time() + self._hold_s
        # The gate is opened by another process: a file is the signal, so it is polled.
        while not (self._gate_dir / OPEN).exists() and loop.time() < until:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        return self._inner.calculator(expression)

    def grade(self, final_text: str | None) -> float:
        return self._inner.grade(final_text)


class GatedArithmetic(ArithmeticEnv):
    """The arithmetic tasks; options `gate_dir` (required), `hold_s`, and arithmetic's own."""

    name = "gated_arithmetic"

    def __init__(self, gate_dir: str, hold_s: float = 120.0, num_tasks: int = 100, seed: int = 0) -> None:
        super().__init__(num_tasks, seed)
        self._gate_dir = Path(gate_dir)
        self._hold_s = hold_s

    def start(self, task: Task) -> GatedWorld:
        return GatedWorld(super().start(task), self._gate_dir, self._hold_s)


def pids_at_gate(gate_dir: Path) -> list[int]:
    """Pids of the processes that have reached the gate so far."""
    return [int(p.name) for p in gate_dir.iterdir() if p.name.isdigit()]


def open_gate(gate_dir: Path) -> None:
    (gate_dir / OPEN).touch()
