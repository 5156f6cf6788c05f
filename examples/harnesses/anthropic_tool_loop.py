"""A plain `anthropic` SDK tool loop: a Messages-API harness the collector does not own.

It reads ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY like any Anthropic program, offers one
`calculator` tool, runs every `tool_use` block it gets back and logs each execution (one JSON
line: id, name, input) to `executions.jsonl` in its working directory. It does not look at
`stop_reason`; the collector's gateway keeps a cut turn's calls from it. With `--stream` it
reads each reply through `client.messages.stream(...)`.

    python examples/harnesses/anthropic_tool_loop.py \
        "What is 2+3? Use the calculator tool, then reply with the number only."
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from anthropic import AsyncAnthropic
from openai_tool_loop import calculate

TOOLS: list[Any] = [
    {
        "name": "calculator",
        "description": "Evaluate an integer arithmetic expression with + - * and parentheses.",
        "input_schema": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    }
]


async def ask(client: AsyncAnthropic, model: str, messages: list[Any], stream: bool) -> Any:
    if not stream:
        return await client.messages.create(model=model, max_tokens=4096, tools=TOOLS, messages=messages)
    async with client.messages.stream(model=model, max_tokens=4096, tools=TOOLS, messages=messages) as events:
        return await events.get_final_message()


async def run(
    client: AsyncAnthropic,
    task: str,
    workdir: Path,
    model: str = "claude-sonnet-4-5",
    steps: int = 8,
    stream: bool = False,
) -> str:
    """The loop: ask, run every `tool_use`, send the results back, until a reply without calls."""
    messages: list[Any] = [{"role": "user", "content": task}]
    log = workdir / "executions.jsonl"
    for _ in range(steps):
        reply = await ask(client, model, messages, stream)
        messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}
        )
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            answer = "".join(b.text for b in reply.content if b.type == "text")
            (workdir / "answer.txt").write_text(answer)
            return answer
        results = []
        for use in uses:
            try:
                result = str(calculate(str(use.input["expression"])))
            except (ValueError, KeyError, TypeError, SyntaxError) as exc:
                result = f"error: {type(exc).__name__}"
            else:
                with log.open("a") as f:
                    f.write(json.dumps({"id": use.id, "name": use.name, "arguments": use.input}) + "\n")
            results.append({"type": "tool_result", "tool_use_id": use.id, "content": result})
        messages.append({"role": "user", "content": results})
    return ""


async def main() -> None:
    async with AsyncAnthropic() as client:
        print(await run(client, sys.argv[1], Path.cwd(), stream="--stream" in sys.argv[2:]))


if __name__ == "__main__":
    asyncio.run(main())
