"""Token truth across turns against a real llama-server (issue 26 #6). Not run in CI.

Runs multi-turn tool episodes (three cities per task, one `get_weather` call each: a few-shot
of the same shape shows the base model the pattern) through the collector's own episode loop,
chat adapter and token tracker, with `sampling.token_ids` on, and prints per mode:
episodes, turns, tool turns per episode, the one-sequence share (trainer view rows per
episode), the drift rate per turn index, and the most common first-difference pairs
(decoded by the server's `/detokenize`).

Modes: ``rerender`` (the chat endpoint re-renders history from messages every turn). The
token-in mode (`sampling.token_in`, issue 26 #4) is not implemented yet, so it is not run.
llama.cpp's chat endpoint returns no prompt ids, so each turn's prompt ids are taken from the
same server's `/apply-template` + `/tokenize` of the request's messages (`RenderedPrompts`):
its own rendering of history. The run also shows the stop-string rule on every call turn.

    PID=$(bash ../shared/tools/real-llama/serve.sh 18082)
    PYTHONPATH=. .venv/bin/python scripts/real_llama/token_truth.py --root http://127.0.0.1:18082
    kill $PID

No network beyond loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))

from weather_env import WeatherWorld

from collector.analysis.trainer import sequence_runs, trainer_rows
from collector.config import LoopConfig
from collector.envs.base import Environment, Task
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint
from collector.providers.chat import build_chat_body
from collector.record.shards import episodes_to_table
from collector.turn import (
    ArgStatus,
    AssistantMessage,
    Message,
    SamplingParams,
    ToolCall,
    ToolResultMessage,
    Turn,
    TurnRequest,
    UserMessage,
)

_SHOTS = ((("Berlin", 14), ("Madrid", 25), ("Rome", 22)), (("Boston", 9), ("Denver", 4), ("Miami", 28)))
_TASKS = (("Paris", "Tokyo", "Lima"), ("Oslo", "Cairo", "Quito"), ("Perth", "Dakar", "Lisbon"),
          ("Seoul", "Delhi", "Nairobi"))


def _shot(n: int, cities: Sequence[tuple[str, int]]) -> list[Message]:
    names = ", ".join(c for c, _ in cities[:-1]) + " and " + cities[-1][0]
    out: list[Message] = [UserMessage(f"What is the weather in {names}? One city at a time.")]
    for k, (city, degrees) in enumerate(cities):
        args = {"city": city, "unit": "celsius"}
        call = ToolCall(f"call_shot{n}{k}", "get_weather", args, ArgStatus.OK, raw_arguments=json.dumps(args))
        out += [AssistantMessage("", [call]),
                ToolResultMessage(call.id, "get_weather",
                                  json.dumps({"city": city, "degrees": degrees, "unit": "celsius"}))]
    out.append(AssistantMessage(" ".join(f"{c}: {d} degrees celsius." for c, d in cities)))
    return out


class ThreeCities(Environment):
    name = "weather_three_cities"

    def tasks(self) -> Sequence[Task]:
        shots = [m for n, cities in enumerate(_SHOTS) for m in _shot(n, cities)]
        return [Task("weather-" + "-".join(c.lower() for c in cities),
                     [*shots, UserMessage(f"What is the weather in {cities[0]}, {cities[1]} and {cities[2]}? "
                                          "One city at a time.")], {"city": cities[0]})
                for cities in _TASKS]

    def start(self, task: Task) -> WeatherWorld:
        return WeatherWorld(str(task.metadata["city"]))


async def _detok(client: httpx.AsyncClient, root: str, ids: list[int]) -> str:
    r = await client.post(root + "/detokenize", json={"tokens": ids})
    return str(r.json().get("content"))


class RenderedPrompts:
    """The chat adapter, with each turn's prompt ids as this server renders and tokenizes them.

    llama.cpp's chat endpoint returns no prompt ids; it renders the messages with its template
    and tokenizes the result. `/apply-template` + `/tokenize` (special tokens parsed, BOS
    added) is that same rendering, asked separately: the ids the re-rendering server saw.
    """

    kind = "chat"

    def __init__(self, inner: Any, client: httpx.AsyncClient, root: str) -> None:
        self.inner, self.client, self.root = inner, client, root

    async def complete(self, request: TurnRequest) -> Turn:
        turn = await self.inner.complete(request)
        body = build_chat_body(request, "max_tokens", False)
        r = await self.client.post(self.root + "/apply-template",
                                   json={"messages": body["messages"], "tools": body.get("tools")})
        text = r.json()["prompt"]
        r = await self.client.post(self.root + "/tokenize",
                                   json={"content": text, "add_special": True, "parse_special": True})
        return dataclasses.replace(turn, prompt_token_ids=[int(i) for i in r.json()["tokens"]])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def run(root: str, model: str, cap: int) -> int:
    env = ThreeCities()
    endpoint = Endpoint(base_url_for("chat", root), streaming=False, cap_field="max_tokens",
                        request_timeout_s=300.0)
    params = SamplingParams(temperature=0.0, stop=["</tool_call>"], token_ids=True)
    async with httpx.AsyncClient(timeout=300) as client:
        provider = RenderedPrompts(build_provider("chat", endpoint, client), client, root)
        episodes = [await run_episode(EpisodeSpec("token-truth", model, "chat", cap, task, sampling=params),
                                      provider, env, LoopConfig(max_steps=6))  # type: ignore[arg-type]
                    for task in env.tasks()]
        rows = episodes_to_table(episodes).to_pylist()
        view = trainer_rows(rows, "sequence")
        per_turn: Counter[int] = Counter()
        drifted: Counter[int] = Counter()
        pairs: Counter[tuple[int | None, int | None]] = Counter()
        tool_turns = []
        one = with_ids = 0
        for ep in rows:
            turns = ep["turns"]
            tool_turns.append(sum(t["num_tool_calls"] > 0 for t in turns))
            if turns and all(t["prompt_token_ids"] is not None for t in turns):
                with_ids += 1
                one += len(sequence_runs(turns)) == 1
            for t in turns[1:]:
                if t["prefix_consistent"] is None:
                    continue
                per_turn[t["index"]] += 1
                if not t["prefix_consistent"]:
                    drifted[t["index"]] += 1
                    pairs[(t["drift_expected_id"], t["drift_found_id"])] += 1
        print(f"mode=rerender episodes={len(rows)} turns={sum(len(e['turns']) for e in rows)} "
              f"tool_turns_per_episode={tool_turns} "
              f"stops={dict(Counter(str(e['stop_reason']) for e in rows))}")
        print(f"  trainer view: {len(view.rows)} rows, left out {dict(view.skipped)}; "
              f"one sequence: {one} of {with_ids} episodes with prompt ids")
        print("  drift rate by turn: " + " ".join(
            f"t{k}={drifted[k]}/{n}" for k, n in sorted(per_turn.items())))
        for (exp, found), n in pairs.most_common(5):
            e = await _detok(client, root, [exp]) if exp is not None else "-"
            f = await _detok(client, root, [found]) if found is not None else "(prompt ended)"
            print(f"  first difference x{n}: expected {exp} {e!r} found {found} {f!r}")
        counts = [(t["token_counts_ok"], t["stop_tokens_uncounted"]) for e in rows for t in e["turns"]]
        print(f"  token_counts_ok/stop_tokens_uncounted per turn: {dict(Counter(counts))}")
    print("mode=token-in: not run (sampling.token_in is not implemented yet)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default="http://127.0.0.1:18082", help="llama-server root URL (loopback)")
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--cap", type=int, default=96)
    args = p.parse_args(argv)
    return asyncio.run(run(args.root, args.model, args.cap))


if __name__ == "__main__":
    raise SystemExit(main())
