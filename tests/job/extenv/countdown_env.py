"""A user's own environment, outside the collector package: found through `env.python_path`.

It uses only the public interface (`collector.envs.base`) and phrases its tasks like the
built-in arithmetic environment, so the simulated model knows how to work them.
"""

from __future__ import annotations

from collections.abc import Sequence

from collector.envs.base import Environment, EpisodeWorld, Task, Tool

PROMPT = "What is {a} + {b}? Use the calculator tool, then reply with the number only."


class _World(EpisodeWorld):
    def __init__(self, answer: int) -> None:
        self.answer = answer
        self._tools = [
            Tool(
                name="calculator",
                description="Add two integers written as 'a + b'.",
                parameters={
                    "type": "object",
                    "properties": {"expression": {"type": "string"}},
                    "required": ["expression"],
                },
                function=self.calculator,
            )
        ]

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    def calculator(self, expression: str) -> str:
        left, _, right = expression.partition("+")
        return str(int(left) + int(right))

    def grade(self, final_text: str | None) -> float:
        return 1.0 if final_text is not None and final_text.strip().endswith(str(self.answer)) else 0.0


class CountdownEnv(Environment):
    """`n` addition tasks; the option `n` comes from the config's `env.options`."""

    name = "countdown"

    def __init__(self, n: int = 4) -> None:
        self._tasks = [
            Task(f"cd-{i}", PROMPT.format(a=10 + i, b=i), {"answer": 10 + 2 * i}) for i in range(n)
        ]

    def tasks(self) -> Sequence[Task]:
        return self._tasks

    def start(self, task: Task) -> EpisodeWorld:
        return _World(int(task.metadata["answer"]))
