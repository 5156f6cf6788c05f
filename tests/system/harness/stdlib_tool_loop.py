"""The arithmetic tool loop of examples/harnesses/openai_tool_loop.py with the standard library only.

The same requests (Chat Completions, one `calculator` tool, every returned call run, then
the answer), but a process that starts in a thirtieth of the time the `openai` SDK needs to
import: for sweeps of hundreds of harness episodes whose subject is the gateway's
bookkeeping, not the SDK (tests/system/harness/test_harness_truth.py). Each execution is
logged to `executions.jsonl` (id, name, arguments), as the SDK loop logs it.

It speaks HTTP/1.1 over a socket itself: `urllib.request` alone (http.client, email, ssl)
doubles its start-up, which a sweep pays once per episode. Run it with `-S` too (no site:
nothing here needs site-packages), as the sweep does.

    python -S tests/system/harness/stdlib_tool_loop.py "What is 2+3? Use the calculator tool, ..."
"""

from __future__ import annotations

import json
import os
import socket
import sys
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
    """One request on a connection of its own; any status but 200 ends the loop (exit status 1)."""
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    host, _, rest = base.removeprefix("http://").partition("/")
    name, _, port = host.partition(":")
    body = json.dumps({"model": "gateway", "messages": messages, "tools": TOOLS, "max_tokens": 4096}).encode()
    head = (f"POST /{rest}/chat/completions HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
            f"Authorization: Bearer {os.environ['OPENAI_API_KEY']}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    with socket.create_connection((name, int(port or 80)), timeout=60) as conn:
        conn.sendall(head.encode() + body)
        reply = b"".join(iter(lambda: conn.recv(65536), b""))  # the server closes: Connection: close
    status, _, payload = reply.partition(b"\r\n\r\n")
    if status.split(b" ", 2)[1] != b"200":
        sys.exit(f"status {status.splitlines()[0].decode()}: {payload[:200].decode(errors='replace')}")
    message: dict[str, Any] = json.loads(payload)["choices"][0]["message"]
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
            with open("answer.txt", "w") as answer:  # open, not pathlib: its import is start-up too
                answer.write(message.get("content") or "")
            return
        for call in message["tool_calls"]:
            try:
                arguments = json.loads(call["function"]["arguments"])
                result = str(calculate(str(arguments["expression"])))
            except (ValueError, KeyError, TypeError, SyntaxError) as exc:
                result = f"error: {type(exc).__name__}"
            else:
                with open("executions.jsonl", "a") as log:
                    entry = {"id": call["id"], "name": "calculator", "arguments": arguments}
                    log.write(json.dumps(entry) + "\n")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})


if __name__ == "__main__":
    main(sys.argv[1])
