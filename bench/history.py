"""How a turn's client CPU grows with the history: 5, 20 and 50-turn episodes.

    .venv/bin/python -m bench.history          # chat and anthropic, 5/20/50 turns, 5 rounds

Every turn the model calls `read_page`, whose result adds 2 KB of *varied* text (random
words: repeated filler encodes 1.8x faster and flattens the slope), until `loop.max_steps`
ends the episode. The episodes are the collector's own (`run_episode`: loop, tools, records,
redaction, adapter) over its real adapters, against an in-process transport that answers
every request at once with a canned tool call (a constant cost per turn), so what grows
with the history is the collector's own work. Nothing but this process runs.

`slope_us_per_kb` is (CPU per turn at 50 turns - at 5 turns) / (mean history per turn at
50 - at 5, in KB of request body): the per-KB cost a turn pays for the history it resends.
Per-episode costs (start, the record) spread over fewer turns at 5 turns and pull that
slope down, so `fit_us_per_kb` fits cpu/turn = a/N + b + c*KB to the three points and
reports c: the per-KB term with the per-episode term taken out.
`whole` is the variant before issue 14 (the whole body encoded every turn, as
`encode_body` did), monkeypatched in for comparison; `spliced` is the shipped code.
Variants are interleaved, round by round.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import median, parser, report
from collector.config import LoopConfig
from collector.envs.base import Environment, EpisodeContext, EpisodeWorld, Task, Tool
from collector.envs.toolkit import tool
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers import build_provider
from collector.providers.base import Endpoint
from collector.providers.common import encode_body
from collector.providers.transport import fast_client

PAGE_BYTES = 2048


def _page(rng: random.Random) -> str:
    words: list[str] = []
    size = 0
    while size < PAGE_BYTES:
        word = "".join(rng.choices("abcdefghijklmnopqrstuvwxyzABCDEFGHIJ0123456789", k=rng.randint(2, 11)))
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:PAGE_BYTES]


#: Made once, so that the tool costs nothing per call: 1,024 different pages.
_PAGES = [_page(random.Random(i)) for i in range(1024)]


def read_page(page: int) -> str:
    """Read one page of the document."""
    return _PAGES[page % len(_PAGES)]


#: Built once (a tool's schema and validator are made by `tool()`; the worker's environments
#: build theirs once too).
_TOOLS = [tool(read_page, inline=True)]


class _World(EpisodeWorld):
    @property
    def tools(self) -> Sequence[Tool]:
        return _TOOLS

    def grade(self, final_text: str | None) -> float:
        return 0.0


class PagesEnv(Environment):
    name = "pages"

    def tasks(self) -> Sequence[Task]:
        return [Task("pages-0", "Read the document page by page.", {})]

    def start(self, task: Task, context: EpisodeContext) -> EpisodeWorld:
        return _World()


class CannedTransport(httpx.AsyncBaseTransport):
    """Answers every request at once with a tool call (fresh call id each time)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.n = 0
        self.body_bytes = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        self.body_bytes += len(body)
        self.n += 1
        cid = f"call_{self.n}"
        args = {"page": self.n * 7919}  # a different page each turn
        if self.kind == "chat":
            reply: dict[str, Any] = {
                "id": "c", "model": "m", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": None, "tool_calls": [
                        {"id": cid, "type": "function",
                         "function": {"name": "read_page", "arguments": json.dumps(args)}}]}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10}}
        else:
            reply = {"id": "msg", "type": "message", "role": "assistant", "model": "m",
                     "content": [{"type": "tool_use", "id": cid, "name": "read_page", "input": args}],
                     "stop_reason": "tool_use", "usage": {"input_tokens": 10, "output_tokens": 10}}
        return httpx.Response(200, content=json.dumps(reply).encode(),
                              headers={"content-type": "application/json"})


def _whole(body: Any, key: str, cache: Any) -> bytes:
    return encode_body(body)


def _use(variant: str) -> None:
    """Point the adapters at the spliced encoder or at the whole-body one (before issue 14)."""
    import collector.providers.anthropic as anthropic
    import collector.providers.chat as chat
    from collector.providers.splice import encode_spliced

    fn = encode_spliced if variant == "spliced" else _whole
    chat.encode_spliced = fn  # type: ignore[attr-defined]
    anthropic.encode_spliced = fn  # type: ignore[attr-defined]


async def _episodes(kind: str, turns: int, episodes: int, in_flight: int) -> tuple[int, int, float]:
    transport = CannedTransport(kind)
    base = "http://canned.test/v1" if kind == "chat" else "http://canned.test"
    client = fast_client(transport)  # the worker's client, over the canned transport
    provider = build_provider(kind, Endpoint(base, api_key="k"), client)
    env = PagesEnv()
    loop = LoopConfig(max_steps=turns, stop_on=["length"])
    task = env.tasks()[0]
    sem = asyncio.Semaphore(in_flight)

    async def one(i: int) -> int:
        async with sem:
            spec = EpisodeSpec("bench", "m", kind, 256, task, sample=i, seed=i, env_name="pages")
            episode = await run_episode(spec, provider, env, loop)
            return len(episode.turns)

    cpu0 = time.process_time()
    counts = await asyncio.gather(*(one(i) for i in range(episodes)))
    cpu = time.process_time() - cpu0
    await client.aclose()
    return sum(counts), transport.body_bytes, cpu


def _fit(points: list[dict[str, Any]]) -> float:
    """The per-KB term of cpu/turn = a/N + b + c*KB (a: per-episode costs spread over N turns)."""
    import numpy as np

    design = np.array([[1.0 / x["turns"], 1.0, x["mean_body_kb"]] for x in points])
    cpu = np.array([x["cpu_us_turn"] for x in points])
    coef = np.linalg.lstsq(design, cpu, rcond=None)[0]
    return float(coef[2])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--kinds", nargs="+", default=["chat", "anthropic"])
    p.add_argument("--turns", type=int, nargs="+", default=[5, 20, 50])
    p.add_argument("--turns-per-point", type=int, default=3000, help="turns measured per (kind, N)")
    p.add_argument("--in-flight", type=int, default=16)
    args = p.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 5)
    if args.quick:
        args.turns, args.turns_per_point = [2, 5], 40
    variants = ["whole", "spliced"]
    rows: list[dict[str, Any]] = []
    for kind in args.kinds:  # warm-up: imports, first-call caches
        asyncio.run(_episodes(kind, min(args.turns), 4, args.in_flight))
    for r in range(rounds):
        for kind in args.kinds:
            for turns in args.turns:
                order = variants[r % 2:] + variants[:r % 2]
                for variant in order:
                    _use(variant)
                    episodes = max(2, args.turns_per_point // turns)
                    n, body_bytes, cpu = asyncio.run(_episodes(kind, turns, episodes, args.in_flight))
                    rows.append({"round": r, "kind": kind, "variant": variant, "turns": turns,
                                 "episode_turns": n / episodes, "mean_body_kb": body_bytes / n / 1024,
                                 "cpu_us_turn": cpu / n * 1e6})
    _use("spliced")
    summary = []
    lo, hi = min(args.turns), max(args.turns)
    for kind in args.kinds:
        for variant in variants:
            def cell(turns: int, key: str, kind: str = kind, variant: str = variant) -> float:
                return median([x[key] for x in rows
                               if x["kind"] == kind and x["variant"] == variant and x["turns"] == turns])
            row: dict[str, Any] = {"kind": kind, "variant": variant}
            for turns in args.turns:
                row[f"us_turn_{turns}"] = cell(turns, "cpu_us_turn")
            for turns in args.turns:
                row[f"kb_{turns}"] = cell(turns, "mean_body_kb")
            slopes, fits = [], []
            for rr in range(rounds):
                mine = {x["turns"]: x for x in rows
                        if x["kind"] == kind and x["variant"] == variant and x["round"] == rr}
                slopes.append((mine[hi]["cpu_us_turn"] - mine[lo]["cpu_us_turn"])
                              / (mine[hi]["mean_body_kb"] - mine[lo]["mean_body_kb"]))
                fits.append(_fit(list(mine.values())))
            row["slope_us_per_kb"] = median(slopes)
            row["slope_range"] = f"{min(slopes):.2f}-{max(slopes):.2f}"
            row["fit_us_per_kb"] = median(fits)
            row["fit_range"] = f"{min(fits):.2f}-{max(fits):.2f}"
            summary.append(row)
    return report("history", "client CPU per turn as the history grows (2 KB varied text per turn)",
                  args, rows, summary)


if __name__ == "__main__":
    main()
