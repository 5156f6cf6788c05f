"""Token-in vs re-render: client CPU and bytes on the wire per turn, on the same episodes (issue 26).

Both modes run the same support-desk tool episodes (sim-drift, cap 512, temperature 0.7)
through the collector's own loop and adapters against the simulator in its own process
(`SimProcess`), with token ids captured:

- ``rerender``: the chat adapter on `/v1/chat/completions` with `sampling.token_ids` (the
  server re-renders history from messages; one request per turn);
- ``token-in``: the token-in adapter (`collector.providers.tokenin`) on the simulator's
  llama-server endpoints: per turn `/apply-template` + `/tokenize` of the history, on later
  turns two probe renders + `/tokenize` of the bridge, then `/completion` with the ids.

Per turn: client CPU (`time.process_time` of this process, which runs only the client), the
server's CPU (its process, read from /proc) and the bytes of every request and response body
(headers not counted), all endpoint calls included. Modes alternate in interleaved rounds; the
medians are printed side by side, with each episode's trainer-view rows (one sequence or not).

    .venv/bin/python -m bench.tokenin [--episodes 48] [--rounds 5] [--in-flight 8]
"""

from __future__ import annotations

import asyncio
import gc
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Clock, SimProcess, median, parser, report
from collector.analysis.trainer import trainer_rows
from collector.config import LoopConfig
from collector.envs.support_desk import SupportDeskEnv
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers import build_provider
from collector.providers.base import Endpoint
from collector.record.episode import Episode
from collector.record.shards import episodes_to_table
from collector.turn import SamplingParams

NAME = "tokenin"
MODEL = "sim-drift"
BUDGET = 512
MODES = ("rerender", "token-in")


class Wire:
    """Counts request and response body bytes and requests, via httpx event hooks."""

    def __init__(self) -> None:
        self.sent = 0
        self.received = 0
        self.requests = 0
        self.by_endpoint: Counter[str] = Counter()
        """Request + response bytes per endpoint (the last path segment)."""

    async def on_request(self, request: httpx.Request) -> None:
        self.sent += len(request.content)
        self.requests += 1
        self.by_endpoint[request.url.path.rsplit("/", 1)[-1]] += len(request.content)

    async def on_response(self, response: httpx.Response) -> None:
        body = await response.aread()  # read first: `+=` around an await would lose updates
        self.received += len(body)
        self.by_endpoint[response.request.url.path.rsplit("/", 1)[-1]] += len(body)


async def _collect(mode: str, root: str, episodes: int, in_flight: int, wire: Wire) -> list[Episode]:
    env = SupportDeskEnv(num_tasks=episodes)
    if mode == "rerender":
        kind, endpoint = "chat", Endpoint(root + "/v1")
        sampling = SamplingParams(token_ids=True, temperature=0.7)
    else:
        kind, endpoint = "token_in", Endpoint(f"{root}/llamacpp/{MODEL}/v1")
        sampling = SamplingParams(token_ids=True, temperature=0.7, token_in="llama.cpp")
    hooks: dict[str, list[Any]] = {"request": [wire.on_request], "response": [wire.on_response]}
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    async with httpx.AsyncClient(event_hooks=hooks, limits=limits, timeout=60.0) as client:
        provider = build_provider(kind, endpoint, client)
        gate = asyncio.Semaphore(in_flight)

        async def one(task: Any) -> Episode:
            async with gate:
                spec = EpisodeSpec("bench", MODEL, "chat", BUDGET, task, env_name=env.name, sampling=sampling)
                return await run_episode(spec, provider, env, LoopConfig(max_steps=6))

        return list(await asyncio.gather(*(one(t) for t in env.tasks())))


def _measure(mode: str, sim: SimProcess, episodes: int, in_flight: int, rnd: int) -> dict[str, Any]:
    wire = Wire()
    gc.collect()
    server0 = sim.cpu_s()
    clock = Clock()
    done = asyncio.run(_collect(mode, sim.root, episodes, in_flight, wire))
    clock.stop()
    server = sim.cpu_s() - server0
    turns = sum(len(e.turns) for e in done)
    view = trainer_rows(episodes_to_table(done).to_pylist(), "sequence")
    rows_per_episode = Counter(r["episode_id"] for r in view.rows)
    multi = [e for e in done if len(e.turns) > 1]
    one_sequence = sum(1 for e in multi if rows_per_episode[e.episode_id] == 1)
    return {"round": rnd, "mode": mode, "episodes": len(done), "turns": turns,
            "requests_per_turn": wire.requests / turns,
            "client_cpu_ms_per_turn": 1000 * clock.cpu / turns,
            "server_cpu_ms_per_turn": 1000 * server / turns,
            "sent_b_per_turn": wire.sent / turns, "received_b_per_turn": wire.received / turns,
            "bytes_per_turn": (wire.sent + wire.received) / turns,
            "one_sequence_share": one_sequence / len(multi) if multi else float("nan"),
            "wall_s": clock.wall,
            "by_endpoint": {k: v / turns for k, v in sorted(wire.by_endpoint.items())}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=48)
    p.add_argument("--in-flight", type=int, default=8)
    args = p.parse_args(argv)
    if args.quick:
        args.episodes, args.rounds = 8, args.rounds or 1
    args.rounds = args.rounds or 5
    rows: list[dict[str, Any]] = []
    with SimProcess() as sim:
        _measure("token-in", sim, min(4, args.episodes), args.in_flight, -1)  # warm both paths up
        _measure("rerender", sim, min(4, args.episodes), args.in_flight, -1)
        for rnd in range(args.rounds):
            for mode in (MODES if rnd % 2 == 0 else MODES[::-1]):
                rows.append(_measure(mode, sim, args.episodes, args.in_flight, rnd))
    # Bytes per turn by endpoint: the same every round (the replies are deterministic); kept
    # for the notes, not the table.
    split = {row["mode"]: row.pop("by_endpoint") for row in rows}
    keys = ("requests_per_turn", "client_cpu_ms_per_turn", "server_cpu_ms_per_turn", "sent_b_per_turn",
            "received_b_per_turn", "bytes_per_turn", "one_sequence_share")
    summary = []
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        summary.append({"mode": mode, "turns": mine[0]["turns"],
                        **{k: median([r[k] for r in mine]) for k in keys}})

    def ratio(key: str) -> float:  # per-round token-in / rerender, median: robust to load
        by = {(r["round"], r["mode"]): r[key] for r in rows}
        return median([by[(i, "token-in")] / by[(i, "rerender")] for i in range(args.rounds)])

    notes = [f"{args.episodes} support_desk episodes on {MODEL} (cap {BUDGET}), {args.in_flight} in flight, "
             f"{args.rounds} interleaved rounds; bytes are request + response bodies, every endpoint call",
             f"token-in / rerender per turn: {ratio('client_cpu_ms_per_turn'):.2f}x client CPU, "
             f"{ratio('server_cpu_ms_per_turn'):.2f}x server CPU, {ratio('bytes_per_turn'):.2f}x bytes, "
             f"{ratio('requests_per_turn'):.2f}x requests (per-round medians)",
             *(f"{mode} bytes per turn by endpoint: "
               + ", ".join(f"{k} {v:,.0f}" for k, v in split[mode].items()) for mode in MODES)]
    return report(NAME, "Token-in vs re-render: CPU and bytes per turn", args, rows, summary, notes)


if __name__ == "__main__":
    main()
