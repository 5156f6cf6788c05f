"""Overhead: the collector's turns/s and client CPU per turn against two bare loops.

Issue 6, item 1a. Three variants run the same episodes against the same simulator
(`bench-zero`, no latency, in its own process), interleaved round by round:

- ``collector``: `EpisodeWorker.run_batch` (client layout, adapter, strict argument
  parsing, episode loop, tools, records) and then a `RunStore.commit` of the episodes
  (Arrow shards, fsync, manifest): everything the collector does per turn, all in. The
  worker's start-up (once per run) is left out; the commit's CPU is counted but not its
  wall time (in a run the driver commits while the workers go on);
- ``collector-client-layer``: the same with `Http`'s direct path off, every request through
  httpx's client layer as before issue 29: the direct path's gain, side by side;
- ``bare-same-setup``: a bare async loop replaying the collector's exact request bodies
  over the same client set-up (one `httpx.AsyncClient` on `StreamTransport`);
- ``bare-httpcore-split``: the same replay over the layout the worker used before
  (ceil(n/8) clients of 8 connections on httpx's default transport), for the record;
- ``plain-httpx``: the same replay over one `httpx.AsyncClient()` with default settings;
- ``bare-http-direct``: the same replay through `Http.post_json` on `fast_client()`, the
  collector's own posting path (prebuilt request, straight to `StreamTransport`, no httpx
  client layer), with its JSON decoding: what the adapters pay for HTTP;
- ``bare-raw-streams``: the same replay over hand-written HTTP/1.1 on asyncio streams, no
  httpx at all: the floor of client CPU per turn in Python, for the record.

Ratios: collector / bare-same-setup (target >= 0.8: the collector's own work is small),
collector / plain-httpx (target >= 1.5: the client set-up is chosen well); CPU per turn of
the collector (target <= 0.5 ms), from `time.process_time()` of this process only; and the
collector's CPU per turn against the hand-written client's (issue 29: target <= 5x).

    .venv/bin/python -m bench.overhead [--episodes 600] [--in-flight 64] [--rounds 5]
"""

from __future__ import annotations

import asyncio
import gc
import sys
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Clock, SimProcess, median, parser, report
from bench.workload import (
    commit,
    items_for,
    make_config,
    record_bodies,
    run_bare_httpcore_split,
    run_bare_raw_streams,
    run_bare_same_setup,
    run_plain_httpx,
    worker_for,
)
from collector.providers import base_url_for
from collector.providers.base import Endpoint
from collector.providers.http import Http
from collector.providers.transport import fast_client
from collector.run.plan import load_env

NAME = "overhead"


async def run_bare_http_direct(bodies: list[list[bytes]], in_flight: int, sim_root: str) -> int:
    """A bare loop through `Http.post_json` on the worker's client: the adapters' posting path."""
    async with fast_client() as client:
        http = Http(client, Endpoint(base_url_for("chat", sim_root), request_timeout_s=60.0), "chat", {})
        url = base_url_for("chat", sim_root) + "/chat/completions"
        queue = list(reversed(bodies))
        turns = 0

        async def slot() -> None:
            nonlocal turns
            while queue:
                for body in queue.pop():
                    await http.post_json(url, body)
                    turns += 1

        await asyncio.gather(*(slot() for _ in range(in_flight)))
        return turns


async def _measure(args: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    cfg = make_config("bench-zero", args.episodes, args.in_flight)
    items = items_for(cfg, args.episodes)
    rows: list[dict[str, Any]] = []
    with SimProcess() as sim:
        bodies = await record_bodies(cfg, items, sim.root)
        turns_expected = sum(len(b) for b in bodies)

        async def collector_client_layer() -> tuple[int, float, float]:
            # `_target` says which requests go direct; None sends all through httpx's client.
            with mock.patch.object(Http, "_target", return_value=None):
                return await collector()

        async def collector() -> tuple[int, float, float]:
            # Start-up (probe, environment, client) happens once per worker per run: left out.
            # The commit is the driver's work, overlapping the workers in a real run: its CPU
            # counts (all in), its wall time (fsync waits) does not.
            worker = worker_for(cfg, sim.root)
            start = Clock()
            await worker.ready()
            start.stop()
            episodes = await worker.run_batch(items)
            end = Clock()
            await worker.close()
            end.stop()
            with tempfile.TemporaryDirectory() as tmp:
                writing = Clock()
                commit(cfg, episodes, tmp)
                writing.stop()
            turns = sum(len(e.turns) for e in episodes)
            return turns, start.wall + end.wall + writing.wall, start.cpu + end.cpu

        variants = {
            "collector": collector,
            "collector-client-layer": collector_client_layer,
            "bare-same-setup": lambda: run_bare_same_setup(bodies, args.in_flight, sim.root),
            "bare-httpcore-split": lambda: run_bare_httpcore_split(bodies, args.in_flight, sim.root),
            "plain-httpx": lambda: run_plain_httpx(bodies, args.in_flight, sim.root),
            "bare-http-direct": lambda: run_bare_http_direct(bodies, args.in_flight, sim.root),
            "bare-raw-streams": lambda: run_bare_raw_streams(bodies, args.in_flight, sim.root),
        }
        await run_bare_same_setup(bodies[: args.in_flight], args.in_flight, sim.root)  # warm-up
        # The collector's warm-up: its first commit imports pyarrow's pandas shim and more
        # (once per process, some ms a turn on a short round), so no round pays for it.
        warm = worker_for(cfg, sim.root)
        warm_episodes = await warm.run_batch(items[: args.in_flight])
        await warm.close()
        with tempfile.TemporaryDirectory() as tmp:
            commit(cfg, warm_episodes, tmp)
        for rnd in range(args.rounds):
            order = list(variants)
            order = order[rnd % len(order):] + order[: rnd % len(order)]  # rotate: no fixed position
            for name in order:
                gc.collect()
                srv0 = sim.cpu_s()
                clock = Clock()
                outcome = await variants[name]()
                clock.stop()
                srv = sim.cpu_s() - srv0
                turns, skip_wall, skip_cpu = outcome if isinstance(outcome, tuple) else (outcome, 0.0, 0.0)
                clock.wall -= skip_wall
                clock.cpu -= skip_cpu
                rows.append({"round": rnd, "variant": name, "episodes": len(items), "turns": turns,
                             "turns_per_s": turns / clock.wall, "cpu_ms_per_turn": 1000 * clock.cpu / turns,
                             "server_cpu_ms_per_turn": 1000 * srv / turns,
                             "client_cpu_util": clock.cpu / clock.wall, "server_cpu_util": srv / clock.wall})
    # The environment's own CPU (building each support_desk world: decoy orders, customers,
    # tickets) is inside the collector's figure but is no part of the collector: measure it.
    env = load_env(cfg)
    by_id = {t.id: t for t in env.tasks()}
    clock = Clock()
    for item in items:
        env.start(by_id[item.task_id]).tools  # noqa: B018 - building the tools is part of start
    env_ms_per_turn = 1000 * clock.stop().cpu / turns_expected
    summary = []
    med: dict[str, dict[str, float]] = {}
    for name in variants:
        mine = [r for r in rows if r["variant"] == name]
        med[name] = {k: median([r[k] for r in mine]) for k in
                     ("turns_per_s", "cpu_ms_per_turn", "server_cpu_ms_per_turn", "client_cpu_util",
                      "server_cpu_util")}
    # Ratios per round (side by side), then their median: sturdier than a ratio of medians.
    def ratio(a: str, b: str, key: str) -> float:
        per_round = []
        for rnd in range(args.rounds):
            ra = [r[key] for r in rows if r["round"] == rnd and r["variant"] == a]
            rb = [r[key] for r in rows if r["round"] == rnd and r["variant"] == b]
            if ra and rb and rb[0]:
                per_round.append(ra[0] / rb[0])
        return median(per_round)

    for name in variants:
        summary.append({"variant": name, **med[name],
                        "x_vs_bare_same_setup": ratio(name, "bare-same-setup", "turns_per_s"),
                        "x_vs_plain_httpx": ratio(name, "plain-httpx", "turns_per_s"),
                        "cpu_x_vs_raw_streams": ratio(name, "bare-raw-streams", "cpu_ms_per_turn")})
    c = med["collector"]["cpu_ms_per_turn"]
    summary[0]["env_cpu_ms_per_turn"] = env_ms_per_turn
    summary[0]["cpu_ms_per_turn_without_env"] = c - env_ms_per_turn
    notes = [
        f"{len(items)} episodes, {turns_expected} turns per variant per round, {args.in_flight} in flight, "
        f"{args.rounds} rounds (medians)",
        "target collector/bare-same-setup >= 0.8: "
        f"{ratio('collector', 'bare-same-setup', 'turns_per_s'):.2f}",
        f"target collector/plain-httpx >= 1.5: {ratio('collector', 'plain-httpx', 'turns_per_s'):.2f}",
        f"target collector CPU per turn <= 0.5 ms: {c:.3f} ms all in, of which the environment's "
        f"world building {env_ms_per_turn:.3f} ms",
        "target collector CPU per turn <= 5x the hand-written client's (bare-raw-streams): "
        f"{ratio('collector', 'bare-raw-streams', 'cpu_ms_per_turn'):.2f}x",
        "CPU per turn, httpx's client layer / the direct path (collector-client-layer / collector): "
        f"{ratio('collector-client-layer', 'collector', 'cpu_ms_per_turn'):.2f}x",
    ]
    return rows, summary, notes


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=600)
    p.add_argument("--in-flight", type=int, default=64)
    args = p.parse_args(argv)
    if args.quick:
        args.episodes, args.in_flight, args.rounds = 16, 8, args.rounds or 1
    args.rounds = args.rounds or 5
    rows, summary, notes = asyncio.run(_measure(args))
    return report(NAME, "Overhead at zero latency: collector vs bare loops", args, rows, summary, notes)


if __name__ == "__main__":
    main()
