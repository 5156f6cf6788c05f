"""Token truth across turns against a real llama-server (issue 26 #6). Not run in CI.

Runs multi-turn tool episodes (three cities per task, one `get_weather` call each: a few-shot
of the same shape shows the base model the pattern) through the collector's own episode loop,
chat adapter and token tracker, with `sampling.token_ids` on, and prints per mode:
episodes, turns, tool turns per episode, the one-sequence share (trainer view rows per
episode), the drift rate per turn index, and the most common first-difference pairs
(decoded by the server's `/detokenize`).

Modes: ``rerender`` (the chat endpoint re-renders history from messages every turn;
llama.cpp's chat endpoint returns no prompt ids, so each turn's prompt ids are taken from the
same server's `/apply-template` + `/tokenize` of the request's messages, `RenderedPrompts`:
its own rendering of history) and ``token-in`` (`sampling.token_in`, the
`collector.providers.tokenin` adapter; `RecordedTokenIn` keeps each `/completion` prompt as
sent and each reply's raw text). Token-in also prints that every stored prompt equals the
ids sent, that their `/detokenize` renders the conversation (every tool result in order,
ending on the generation prompt), and that the output ids detokenize to the raw text. The
run also shows the stop-string rule on every call turn. The table is quoted in
docs/tokens.md.

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

from collector.analysis.trainer import full_prompts, sequence_runs, trainer_rows
from collector.config import LoopConfig
from collector.envs.base import Environment, Task
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint
from collector.providers.chat import build_chat_body
from collector.providers.tokenin import TokenInProvider
from collector.providers.tokenin_llama import LlamaServer
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


class _RecordedLlama(LlamaServer):
    """llama.cpp's dialect, handing each `/completion` prompt and reply to `log`."""

    def __init__(self, http: Any, root: str, log: RecordedTokenIn) -> None:
        super().__init__(http, root)
        self.log = log

    async def post(self, path: str, body: dict[str, Any], extra: dict[str, str]) -> tuple[Any, float]:
        if path == "/completion":
            self.log.sent.append(body["prompt"])
        return await super().post(path, body, extra)

    def _parse(self, payload: Any, request: TurnRequest, elapsed: float) -> Turn:
        turn = super()._parse(payload, request, elapsed)
        self.log.raw.append((str(payload.get("content")), turn.token_ids))
        return turn


class RecordedTokenIn(TokenInProvider):
    """The token-in adapter, keeping what went over the wire: each `/completion` prompt as
    sent, and each reply's raw text with the output ids the turn stores."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[list[int] | str] = []
        self.raw: list[tuple[str, list[int] | None]] = []
        self._servers["llama.cpp"] = _RecordedLlama(self._http, self._root, self)


def _pct(n: int, d: int) -> str:
    return f"{n}/{d} ({100 * n / d:.0f}%)" if d else "0/0"


async def _mode(mode: str, root: str, model: str, cap: int, client: httpx.AsyncClient) -> dict[str, Any]:
    env = ThreeCities()
    endpoint = Endpoint(base_url_for("chat", root), streaming=False, cap_field="max_tokens",
                        request_timeout_s=300.0)
    token_in = mode == "token-in"
    params = SamplingParams(temperature=0.0, stop=["</tool_call>"], token_ids=True,
                            token_in="llama.cpp" if token_in else None)
    recorded = RecordedTokenIn(endpoint, client) if token_in else None
    provider: Any = recorded if recorded is not None else RenderedPrompts(
        build_provider("chat", endpoint, client), client, root)
    episodes = [await run_episode(EpisodeSpec("token-truth", model, "chat", cap, task, sampling=params),
                                  provider, env, LoopConfig(max_steps=6))
                for task in env.tasks()]
    rows = episodes_to_table(episodes).to_pylist()
    view = trainer_rows(rows, "sequence")
    per_turn: Counter[int] = Counter()
    drifted: Counter[int] = Counter()
    pairs: Counter[tuple[int | None, int | None]] = Counter()
    one = with_ids = 0
    for ep in rows:
        turns = ep["turns"]
        if turns and all(p is not None for p in full_prompts(turns)):
            with_ids += 1
            one += len(sequence_runs(turns)) == 1
        for t in turns[1:]:
            if t["prefix_consistent"] is None:
                continue
            per_turn[t["index"]] += 1
            # Re-render: the prompt broke the sequence. Token-in: the ids sent are the sequence by
            # construction; the drift is where the server's own re-rendering departs from them.
            if t["drift_offset"] is not None:
                drifted[t["index"]] += 1
                pairs[(t["drift_expected_id"], t["drift_found_id"])] += 1
    out: dict[str, Any] = {
        "mode": mode, "episodes": len(rows), "turns": sum(len(e["turns"]) for e in rows),
        "tool_turns": [sum(t["num_tool_calls"] > 0 for t in e["turns"]) for e in rows],
        "stops": dict(Counter(str(e["stop_reason"]) for e in rows)),
        "rows": len(view.rows), "skipped": dict(view.skipped), "one": one, "with_ids": with_ids,
        "drift": " ".join(f"t{k}={drifted[k]}/{n}" for k, n in sorted(per_turn.items())),
        "drift_total": (sum(drifted.values()), sum(per_turn.values())), "pairs": pairs,
        "counts": dict(Counter((t["token_counts_ok"], t["stop_tokens_uncounted"])
                               for e in rows for t in e["turns"])),
    }
    if recorded is not None:
        stored = [p for e in rows for p in full_prompts(e["turns"])]
        as_ids = [t["prompt_sent_as_ids"] for e in rows for t in e["turns"]]
        out["as_ids"] = _pct(sum(bool(a) for a in as_ids), len(as_ids))
        out["fallbacks"] = dict(Counter(t["token_in_fallback"] for e in rows for t in e["turns"]
                                        if t["token_in_fallback"]))
        out["sent_equal"] = _pct(sum(s == p for s, p in zip(recorded.sent, stored, strict=True)),
                                 len(stored))
        renders = 0
        for ep, prompts in zip(rows, (full_prompts(e["turns"]) for e in rows), strict=True):
            # Each tool result (the few-shot's and the episode's own, by turn), in order.
            results = [(m["turn_index"], m["text"]) for m in ep["messages"] if m["role"] == "tool"]
            for k, prompt in enumerate(prompts):
                text = await _detok(client, root, prompt or [])
                shown = [r for at, r in results if at is None or at < k]
                pos, ok = 0, text.endswith("<start_of_turn>assistant\n")
                for r in shown:
                    pos = text.find(str(r), pos)
                    ok = ok and pos >= 0
                renders += ok
        out["detok_renders"] = _pct(renders, len(stored))
        raw_ok = 0
        for content, ids in recorded.raw:
            raw_ok += ids is not None and await _detok(client, root, ids) == content
        out["output_detok"] = _pct(raw_ok, len(recorded.raw))
    return out


async def run(root: str, model: str, cap: int) -> int:
    async with httpx.AsyncClient(timeout=300) as client:
        results = [await _mode(mode, root, model, cap, client) for mode in ("rerender", "token-in")]
        print("| mode | episodes | turns | tool turns/episode | trainer rows | one sequence | "
              "drift per turn (re-rendered prompt differs) |")
        print("|---|---|---|---|---|---|---|")
        for r in results:
            d, n = r["drift_total"]
            print(f"| {r['mode']} | {r['episodes']} | {r['turns']} | {r['tool_turns']} | {r['rows']} | "
                  f"{_pct(r['one'], r['episodes'])} | {_pct(d, n)}: {r['drift']} |")
        print()
        for r in results:
            print(f"{r['mode']}: stops {r['stops']}; trainer view left out {r['skipped'] or 'none'}; "
                  f"token_counts_ok/stop_tokens_uncounted {r['counts']}")
            for (exp, found), n in r["pairs"].most_common(3):
                e = await _detok(client, root, [exp]) if exp is not None else "-"
                f = await _detok(client, root, [found]) if found is not None else "(prompt ended)"
                print(f"  first difference x{n}: sent/expected {exp} {e!r}, re-rendered {found} {f!r}")
            if "as_ids" in r:
                print(f"  prompts sent as ids: {r['as_ids']}, fallbacks {r['fallbacks'] or 'none'}; "
                      f"stored prompt ids == ids sent: {r['sent_equal']}; /detokenize of them renders "
                      f"the conversation: {r['detok_renders']}; output ids /detokenize to the raw "
                      f"text: {r['output_detok']}")
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
