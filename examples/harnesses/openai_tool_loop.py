"""A plain `openai` SDK tool loop: the kind of agent harness the collector does not own.

It reads OPENAI_BASE_URL and OPENAI_API_KEY like any OpenAI program, offers one `calculator`
tool, runs every tool call the model returns, and logs each execution (one JSON line per
call: id, name, arguments) to `executions.jsonl` in its working directory. It checks nothing
about finish reasons, as most hand-written loops do not: the collector's gateway is what
keeps it from running a call of a cut turn. The final answer goes to `answer.txt`. With
`--stream` it asks for streamed replies and accumulates the deltas, as streaming loops do.

    python examples/harnesses/openai_tool_loop.py \
        "What is 2+3? Use the calculator tool, then reply with the number only."
"""

from __future__ import annotations

import ast
import asyncio
import json
import operator
import sys
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an integer arithmetic expression with + - * and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expression: str) -> int:
    def walk(node: ast.expr) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError("not an integer expression")

    return walk(ast.parse(expression.strip(), mode="eval").body)


async def ask(client: AsyncOpenAI, model: str, messages: list[Any], stream: bool) -> dict[str, Any]:
    """One assistant message as a dict, from a plain reply or accumulated from a stream."""
    if not stream:
        reply = await client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, max_tokens=4096
        )
        return reply.choices[0].message.model_dump(exclude_none=True)
    text, calls = "", dict[int, dict[str, Any]]()
    chunks = await client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, max_tokens=4096, stream=True
    )
    async for chunk in chunks:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                blank = {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                call = calls.setdefault(delta.index, blank)
                call["id"] = delta.id or call["id"]
                if delta.function is not None:
                    call["function"]["name"] += delta.function.name or ""
                    call["function"]["arguments"] += delta.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


async def run(
    client: AsyncOpenAI,
    task: str,
    workdir: Path,
    model: str = "gpt-4o-mini",
    steps: int = 8,
    stream: bool = False,
) -> str:
    """The loop: ask, run every returned call, append results, until an answer without calls."""
    messages: list[Any] = [{"role": "user", "content": task}]
    log = workdir / "executions.jsonl"
    for _ in range(steps):
        message = await ask(client, model, messages, stream)
        messages.append(message)
        if not message.get("tool_calls"):
            (workdir / "answer.txt").write_text(message.get("content") or "")
            return str(message.get("content") or "")
        for call in message["tool_calls"]:
            try:
                arguments = json.loads(call["function"]["arguments"])
                result = str(calculate(str(arguments["expression"])))
            except (ValueError, KeyError, TypeError, SyntaxError) as exc:
                result = f"error: {type(exc).__name__}"
            else:
                entry = {"id": call["id"], "name": call["function"]["name"], "arguments": arguments}
                with log.open("a") as f:
                    f.write(json.dumps(entry) + "\n")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return ""


async def main() -> None:
    async with AsyncOpenAI() as client:
        print(await run(client, sys.argv[1], Path.cwd(), stream="--stream" in sys.argv[2:]))


if __name__ == "__main__":
    asyncio.run(main())
