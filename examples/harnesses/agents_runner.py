"""An `openai-agents` Runner with a function tool: a Responses-API harness the collector does not own.

The Agent's model is the Responses API at OPENAI_BASE_URL with OPENAI_API_KEY (tracing off:
nothing leaves the machine). Its one tool, `calculator`, logs every execution (one JSON line:
call id, name, arguments) to `executions.jsonl` in the working directory. The Runner runs every
call the model returns; the collector's gateway keeps a cut turn's calls from it.

    python examples/harnesses/agents_runner.py \
        "What is 2+3? Use the calculator tool, then reply with the number only."
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from agents import Agent, OpenAIResponsesModel, RunContextWrapper, Runner, function_tool, set_tracing_disabled
from agents.tool_context import ToolContext
from openai import AsyncOpenAI
from openai_tool_loop import calculate


def build_agent(client: AsyncOpenAI, workdir: Path, model: str = "gpt-4.1-mini") -> Agent[Any]:
    log = workdir / "executions.jsonl"

    @function_tool
    def calculator(ctx: RunContextWrapper[Any], expression: str) -> str:
        """Evaluate an integer arithmetic expression with + - * and parentheses."""
        call_id = ctx.tool_call_id if isinstance(ctx, ToolContext) else ""
        with log.open("a") as f:
            f.write(
                json.dumps({"id": call_id, "name": "calculator", "arguments": {"expression": expression}})
                + "\n"
            )
        return str(calculate(expression))

    return Agent(
        name="calculator agent",
        instructions="Use the calculator tool for arithmetic.",
        tools=[calculator],
        model=OpenAIResponsesModel(model=model, openai_client=client),
    )


async def run(client: AsyncOpenAI, task: str, workdir: Path, steps: int = 8) -> str:
    set_tracing_disabled(True)
    result = await Runner.run(build_agent(client, workdir), task, max_turns=steps)
    answer = str(result.final_output or "")
    (workdir / "answer.txt").write_text(answer)
    return answer


async def main() -> None:
    async with AsyncOpenAI() as client:
        print(await run(client, sys.argv[1], Path.cwd()))


if __name__ == "__main__":
    asyncio.run(main())
