"""`arithmetic`: the simple built-in environment, a calculator tool and a number to find.

Tests: tests/envs/test_builtin.py.

Prompt (shared with the simulator's policy, which recognises it by regular expression):
``What is {expr}? Use the calculator tool, then reply with the number only.`` where
`{expr}` has 2-4 positive integer operands joined by ``+``, ``-`` or ``*``.

The one tool, `calculator(expression: str)`, evaluates integer arithmetic by walking the
parsed expression (never `eval`): only integer literals, ``+ - *``, unary minus and
parentheses, short inputs and bounded magnitudes. The grade is 1.0 when the last number
in the final answer equals the true value, else 0.0.

Tasks are generated deterministically from `seed`. Tasks from a file (`env.task_file`)
work too: the expression comes from `metadata["expression"]` or, failing that, from the
prompt text.
"""

from __future__ import annotations

import ast
import random
import re
import threading
from collections.abc import Sequence

from collector.envs.base import Environment, EpisodeContext, EpisodeWorld, Task, Tool, generated_task_count
from collector.envs.toolkit import tool
from collector.turn import UserMessage

PROMPT = "What is {expr}? Use the calculator tool, then reply with the number only."
_PROMPT_RE = re.compile(r"What is (?P<expr>[0-9][0-9+\-* ]*[0-9])\? Use the calculator tool")
_NUMBER = re.compile(r"-?\d+")
_MAX_CHARS = 200
_MAX_MAGNITUDE = 10**18
#: CPython 3.11's AST constructor keeps its recursion depth in interpreter-wide state, so two
#: threads parsing at once can raise "SystemError: AST constructor recursion depth mismatch".
#: The calculator is a plain tool (it runs on a thread, concurrently across episodes) and the
#: tasks are parsed by every worker as it starts (threads of one process with the in-process
#: pool): one parse at a time. A parse of at most 200 characters takes microseconds.
_PARSE_LOCK = threading.Lock()


def evaluate(expression: str) -> int:
    """The value of an integer expression with + - * and parentheses; ValueError otherwise."""
    if len(expression) > _MAX_CHARS:
        raise ValueError(f"expression longer than {_MAX_CHARS} characters")
    try:
        with _PARSE_LOCK:
            tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError("not an arithmetic expression") from None
    return _walk(tree.body)


def _walk(node: ast.expr) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        value = node.value
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = -_walk(node.operand)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult):
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Add):
            value = left + right
        elif isinstance(node.op, ast.Sub):
            value = left - right
        else:
            value = left * right
    else:
        raise ValueError("only integers, + - * and parentheses are allowed")
    if abs(value) > _MAX_MAGNITUDE:
        raise ValueError("value too large")
    return value


class ArithmeticWorld(EpisodeWorld):
    """One episode: the calculator, and the true value to grade against."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.calls = 0
        self._tools = (tool(self.calculator, inline=True),)

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    def calculator(self, expression: str) -> str:
        """Evaluate an integer arithmetic expression (+, -, *, parentheses) and return its value."""
        self.calls += 1
        return str(evaluate(expression))

    def grade(self, final_text: str | None) -> float:
        numbers = _NUMBER.findall(final_text or "")
        return 1.0 if numbers and int(numbers[-1]) == self.expected else 0.0


class ArithmeticEnv(Environment):
    """Generated arithmetic tasks; options: `num_tasks`, `seed`."""

    name = "arithmetic"

    def __init__(self, num_tasks: int = 100, seed: int = 0) -> None:
        rng = random.Random(f"arithmetic:{seed}")
        self._tasks = [self._make(rng, i) for i in range(generated_task_count(num_tasks))]

    @staticmethod
    def _make(rng: random.Random, index: int) -> Task:
        operands = [str(rng.randint(1, 99)) for _ in range(rng.randint(2, 4))]
        expr = operands[0]
        for operand in operands[1:]:
            expr += f" {rng.choice('+-*')} {operand}"
        metadata = {"expression": expr, "answer": evaluate(expr)}
        return Task(f"arith-{index:04d}", PROMPT.format(expr=expr), metadata)

    def tasks(self) -> Sequence[Task]:
        return self._tasks

    def start(self, task: Task, context: EpisodeContext | None = None) -> ArithmeticWorld:
        return ArithmeticWorld(_expected(task))

    def check_task(self, task: Task) -> str | None:
        try:
            _expected(task)
        except ValueError as exc:
            return str(exc)
        return None


def _expected(task: Task) -> int:
    expression = task.metadata.get("expression")
    if not isinstance(expression, str):
        expression = _expression_from_prompt(task)
    return evaluate(expression)


def _expression_from_prompt(task: Task) -> str:
    texts = [task.prompt] if isinstance(task.prompt, str) else [
        m.text for m in task.prompt if isinstance(m, UserMessage)
    ]
    for text in reversed(texts):
        match = _PROMPT_RE.search(text)
        if match:
            return match.group("expr")
    raise ValueError("no expression in metadata or prompt")
