"""The harnesses of `bench.harness_gateway`: many calculator tool loops in one child process.

Says `ready` once imported, then reads one line of JSON, `{"base_url", "in_flight",
"episodes": [{"token", "prompt"}]}`, from stdin, runs every
episode's loop against the gateway (a bare httpx client, the least a harness can spend), and
prints the number of requests sent. A separate process, so that the bench's own CPU figures
hold the gateway's work and not the harnesses'.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx

_PARAMETERS = {"type": "object", "properties": {"expression": {"type": "string"}}}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate integer arithmetic.",
            "parameters": _PARAMETERS,
        },
    }
]


async def episode(client: httpx.AsyncClient, base_url: str, token: str, prompt: str, model: str) -> int:
    messages: list[Any] = [{"role": "user", "content": prompt}]
    headers = {"authorization": f"Bearer {token}"}
    for sent in range(1, 9):
        reply = await client.post(
            f"{base_url}/chat/completions",
            headers=headers,
            json={"model": model, "messages": messages, "tools": TOOLS},
        )
        if reply.status_code != 200:
            return sent
        message = reply.json()["choices"][0]["message"]
        messages.append(message)
        if not message.get("tool_calls"):
            return sent
        for call in message["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "42"})
    return 8


async def main() -> None:
    print("ready", flush=True)  # imports done: the bench starts its clock now
    job = json.loads(sys.stdin.readline())
    gate = asyncio.Semaphore(job["in_flight"])
    limits = httpx.Limits(max_connections=job["in_flight"], max_keepalive_connections=job["in_flight"])
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:

        async def one(e: dict[str, str]) -> int:
            async with gate:
                return await episode(client, job["base_url"], e["token"], e["prompt"], job.get("model", "m"))

        counts = await asyncio.gather(*(one(e) for e in job["episodes"]))
    print(sum(counts))


if __name__ == "__main__":
    asyncio.run(main())
