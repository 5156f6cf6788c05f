"""The harnesses of `bench.harness_gateway`: many calculator tool loops in one child process.

Says `ready` once imported, then reads one line of JSON from stdin:
`{"base_url", "in_flight", "model"?, "body"?, "episodes": [{"token", "prompt", "base_url"?, "headers"?,
"body"?}]}`,
runs every episode's loop against `base_url` (a bare httpx client, the least a harness can
spend), and prints one line of JSON: the requests sent, this process's CPU seconds over them,
and the request latencies' percentiles (ms) as the harness saw them. `body` (the job's, then
the episode's) is merged into every request: pointed straight at the simulator, the harnesses
send what the gateway would have added (the cap, the seed; the latency and seed headers), so
both paths ask for the same turns. A separate process, so that the bench's own CPU figures hold
the gateway's work and not the harnesses'.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
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


async def episode(
    client: httpx.AsyncClient, base_url: str, e: dict[str, Any], model: str, extra: dict[str, Any],
    latencies: list[float],
) -> int:
    messages: list[Any] = [{"role": "user", "content": e["prompt"]}]
    headers = {"authorization": f"Bearer {e['token']}", **e.get("headers", {})}
    for sent in range(1, 9):
        t0 = time.perf_counter()
        reply = await client.post(
            f"{base_url}/chat/completions",
            headers=headers,
            json={"model": model, "messages": messages, "tools": TOOLS, **extra, **e.get("body", {})},
        )
        latencies.append(time.perf_counter() - t0)
        if reply.status_code != 200:
            return sent
        message = reply.json()["choices"][0]["message"]
        messages.append(message)
        if not message.get("tool_calls"):
            return sent
        for call in message["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "42"})
    return 8


def percentiles_ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}
    at = lambda q: round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)  # noqa: E731
    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(1000 * ordered[-1], 1)}


async def main() -> None:
    print("ready", flush=True)  # imports done: the bench starts its clock now
    job = json.loads(sys.stdin.readline())
    gate = asyncio.Semaphore(job["in_flight"])
    limits = httpx.Limits(max_connections=job["in_flight"], max_keepalive_connections=job["in_flight"])
    latencies: list[float] = []
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        cpu0 = time.process_time()  # after the client's set-up (its TLS context): per-request work only

        async def one(e: dict[str, Any]) -> int:
            async with gate:
                base_url = e.get("base_url", job["base_url"])  # an episode's own root, where it has one
                model, extra = job.get("model", "m"), job.get("body", {})
                return await episode(client, base_url, e, model, extra, latencies)

        counts = await asyncio.gather(*(one(e) for e in job["episodes"]))
    print(json.dumps({"requests": sum(counts), "cpu_s": time.process_time() - cpu0,
                      "latency_ms": percentiles_ms(latencies)}))


if __name__ == "__main__":
    asyncio.run(main())
