"""The arithmetic tool loop of examples/harnesses/openai_tool_loop.py with the standard library only.

The same requests (Chat Completions, one `calculator` tool, every returned call run, then
the answer), but a process that starts in a twentieth of the time the `openai` SDK needs to
import: for sweeps of hundreds of harness episodes whose subject is the gateway's
bookkeeping, not the SDK (tests/system/harness/test_harness_truth.py). Each execution is
logged to `executions.jsonl` (id, name, arguments), as the SDK loop logs it.

    python tests/system/harness/stdlib_tool_loop.py "What is 2+3? Use the calculator tool, ..."
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

TOOLS = [
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


def ask(messages: list[Any]) -> dict[str, Any]:
    body = json.dumps({"model": "gateway", "messages": messages, "tools": TOOLS, "max_tokens": 4096})
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions", data=body.encode(),
        headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
                 "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        message: dict[str, Any] = json.load(reply)["choices"][0]["message"]
    return {key: value for key, value in message.items() if value is not None}


def calculate(expression: str) -> int:
    if not set(expression) <= set("0123456789+-* ()"):
        raise ValueError("not an integer expression")
    return int(eval(expression, {"__builtins__": {}}))  # digits, operators and brackets only


def main(task: str, steps: int = 8) -> None:
    messages: list[Any] = [{"role": "user", "content": task}]
    for _ in range(steps):
        message = ask(messages)
        messages.append(message)
        if not message.get("tool_calls"):
            Path("answer.txt").write_text(message.get("content") or "")
            return
        for call in message["tool_calls"]:
            try:
                arguments = json.loads(call["function"]["arguments"])
                result = str(calculate(str(arguments["expression"])))
            except (ValueError, KeyError, TypeError, SyntaxError) as exc:
                result = f"error: {type(exc).__name__}"
            else:
                with Path("executions.jsonl").open("a") as log:
                    entry = {"id": call["id"], "name": "calculator", "arguments": arguments}
                    log.write(json.dumps(entry) + "\n")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})


if __name__ == "__main__":
    main(sys.argv[1])
