"""Token capture against a real llama-server: the ids the collector stores are the ids it sampled.

Not part of CI (it needs the server of ../shared/tools/real-llama/). For each output cap, one
few-shot tool-calling request goes through the collector's own chat adapter with
`sampling.token_ids` on, and the raw reply bytes are kept on the way. Required, per request:

- the adapter's output ids equal the `id`s of the raw reply's `logprobs.content[]`, in order;
- their count equals the reply's `usage.completion_tokens`; the logprobs are as many;
- the fields llama.cpp does not know (`return_token_ids`, `return_prompt_token_ids`) are ignored.

Cases: ``json+tools`` (non-streaming, tools offered) and ``stream`` (streaming, no tools:
llama.cpp refuses logprobs on a streamed request with tools). Two more show what the server
does and how the collector records it (not failures): ``json+tools+stop``, where a stop string
ends the turn and llama.cpp counts its tokens in usage but leaves them out of the logprobs
(the stop-string rule of `collector.episode.tokens` accounts for them: `token_counts_ok` true,
`stop_tokens_uncounted` the shortfall, so the trainer view keeps the episode),
and ``stream+tools``, refused with a 400, which the adapter answers by asking again without
token capture (the turn: ids asked for, not returned).

    PID=$(bash ../shared/tools/real-llama/serve.sh 18082)
    .venv/bin/python scripts/check_llama_tokens.py --base-url http://127.0.0.1:18082/v1
    kill $PID

Exit code 0 when every check holds, 1 otherwise; one line per request either way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from collector.episode.tokens import TokenTracker
from collector.providers import build_provider
from collector.providers.base import Endpoint
from collector.record.episode import TurnRecord
from collector.turn import (
    ArgStatus,
    AssistantMessage,
    SamplingParams,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    TurnRequest,
    UserMessage,
)

WEATHER = ToolSpec("get_weather", "Current weather for a city.", {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
})


def _shot(i: int, city: str, unit: str, result: str) -> list[Any]:
    args = json.dumps({"city": city, "unit": unit})
    call = ToolCall(f"call_{i}", "get_weather", json.loads(args), ArgStatus.OK, raw_arguments=args)
    return [UserMessage(f"What is the weather in {city} in {unit}?"), AssistantMessage("", [call]),
            ToolResultMessage(f"call_{i}", "get_weather", result)]


def request(model: str, cap: int, tools: bool = True, stop: bool = False) -> TurnRequest:
    """The README's few-shot weather request: earlier calls first, then the real question."""
    messages: list[Any] = [SystemMessage("You call tools to answer. Use get_weather for weather questions.")]
    messages += _shot(1, "Paris", "celsius", '{"temp": 18}')
    messages += _shot(2, "Boston", "fahrenheit", '{"temp": 64}')
    messages.append(UserMessage("What is the weather in Tokyo in celsius?"))
    params = SamplingParams(temperature=0.0, seed=1, stop=["</tool_call>"] if stop else None, token_ids=True)
    return TurnRequest(model, messages, [WEATHER] if tools else [], cap, params)


class KeepBodies(httpx.AsyncBaseTransport):
    """Reads each reply whole and keeps its bytes, then hands the adapter a copy."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.bodies: list[bytes] = []

    async def handle_async_request(self, req: httpx.Request) -> httpx.Response:
        resp = await self.inner.handle_async_request(req)
        body = await resp.aread()
        self.bodies.append(body)
        return httpx.Response(resp.status_code, headers=resp.headers, content=body)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _raw(body: bytes, stream: bool) -> tuple[list[int], int]:
    """(ids of logprobs.content[], usage.completion_tokens) of a raw reply."""
    if not stream:
        reply = json.loads(body)
        entries = (reply["choices"][0].get("logprobs") or {}).get("content") or []
        return [e["id"] for e in entries], reply["usage"]["completion_tokens"]
    ids: list[int] = []
    usage = -1
    for line in body.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            usage = chunk["usage"]["completion_tokens"]
        for choice in chunk.get("choices") or ():
            ids += [e["id"] for e in (choice.get("logprobs") or {}).get("content") or ()]
    return ids, usage


CASES = (  # label, stream, tools, stop string, required
    ("json+tools", False, True, False, True),
    ("stream", True, False, False, True),
    ("json+tools+stop", False, True, True, False),
    ("stream+tools", True, True, False, False),
)


async def check(base_url: str, model: str, caps: list[int]) -> bool:
    ok = True
    transport = KeepBodies()
    async with httpx.AsyncClient(transport=transport, timeout=120) as client:
        for label, stream, tools, stop, required in CASES:
            endpoint = Endpoint(base_url, streaming=stream, cap_field="max_tokens")
            provider = build_provider("chat", endpoint, client)  # a fresh adapter per case
            for cap in caps:
                turn = await provider.complete(request(model, cap, tools, stop))
                raw_ids, usage = _raw(transport.bodies[-1], stream)
                ids = turn.token_ids or []
                same = ids == raw_ids and bool(ids)
                counted = len(ids) == usage == turn.usage.output_tokens
                aligned = turn.logprobs is not None and len(turn.logprobs) == len(ids)
                if required:
                    good = same and counted and aligned
                    verdict = "ok" if good else "MISMATCH"
                elif stop:  # ids still equal the logprobs' ids; the stop-string rule accounts for the rest
                    record = TurnRecord(0, turn.raw_finish_reason, turn.finish_class.value, [], None,
                                        turn.usage.output_tokens, 0, cap, 0.0, [], 0, 0, False)
                    TokenTracker(True, 0.0, ["</tool_call>"]).fill(record, turn)
                    short = turn.usage.output_tokens - len(ids)
                    good = same and aligned and record.token_counts_ok is True
                    verdict = (f"as documented: {short} stop-string tokens counted, not returned, "
                               f"token_counts_ok={record.token_counts_ok} "
                               f"stop_tokens_uncounted={record.stop_tokens_uncounted}"
                               ) if good else "MISMATCH"
                else:  # refused, asked again without token capture
                    good = turn.token_ids is None
                    verdict = "as documented: refused, asked again, no ids" if good else "UNEXPECTED"
                ok &= good
                print(f"{label:<16} max_tokens={cap:<3} finish={turn.raw_finish_reason!s:<10} "
                      f"ids={len(ids):<3} logprobs.content[].id={len(raw_ids):<3} "
                      f"completion_tokens={usage:<3} ids==logprob_ids:{same} count==usage:{counted} "
                      f"-> {verdict}")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:18082/v1")
    p.add_argument("--model", default="gemma3-270m", help="sim-llamacpp: a dry run against `collector sim`")
    p.add_argument("--caps", default="4,12,20,36,64", help="comma-separated max_tokens values")
    args = p.parse_args(argv)
    ok = asyncio.run(check(args.base_url, args.model, [int(c) for c in args.caps.split(",")]))
    print("all checks hold" if ok else "some checks FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
