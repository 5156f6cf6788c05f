"""Concurrency: achieved turns/s against the Little's-law bound, with simulated latency.

Issue 6, item 1b. The simulator's `bench-lat` model answers after a log-normal latency
(median 100 ms, sigma 0.35: about 55-180 ms, mean 106.3 ms). Each worker is the collector's
own `EpisodeWorker` in its own process (as a Ray actor would be, without Ray's start-up),
kept full: an episode is handed over as soon as one ends, so `in_flight` episodes per
worker are always running. Turns are counted over a measurement window after a warm-up, in
steady state (each turn counted at its own end time); the bound is
``workers x in_flight / mean latency``.

The bound ignores the two cores this machine has. So each row also reports the client's and
the server's CPU per turn and utilisation over the window, and ``cpu_bound``: what the
machine's cores could do at that CPU per turn (client + simulator), were they ours alone.
A row short of Little's bound with client CPU near 1.0 is bound by the client's CPU per
turn; one with the server near 1.0 by the simulator (one uvicorn process); one with both
well under 1.0 by other jobs on the shared machine (its load average is in the JSON).

    .venv/bin/python -m bench.concurrency [--in-flight 64 256 1024] [--workers 1 2] [--window 4]
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import SimProcess, median, parser, report
from bench.simserver import LAT_MEAN_S
from bench.workload import items_for, make_config, worker_for

NAME = "concurrency"


async def _drive(root: str, in_flight: int, warmup: float, window: float, share: int, of: int,
                 ready: Any, go: Any) -> dict[str, float]:
    """One worker kept full for warm-up + window; turns of episodes ending inside the window."""
    budget_episodes = int(in_flight * (warmup + window + 2) / (2 * LAT_MEAN_S) * 1.5) + in_flight
    cfg = make_config("bench-lat", budget_episodes * of, in_flight)
    items = items_for(cfg, budget_episodes * of)[share::of]
    worker = worker_for(cfg, root)
    await worker.ready()
    ready.set()
    await asyncio.to_thread(go.wait)  # all workers start together
    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    w0, w1 = start + warmup, start + warmup + window
    cpu = {"start": 0.0, "end": 0.0}
    turns = 0
    episodes = 0
    feed = iter(items)
    finished = loop.create_future()
    outstanding = 0

    def spawn() -> None:
        nonlocal outstanding
        item = next(feed, None)
        if item is None:
            return
        outstanding += 1
        task = loop.create_task(worker.run_batch([item]))
        task.add_done_callback(done)

    def done(task: asyncio.Task[Any]) -> None:
        nonlocal turns, episodes, outstanding
        outstanding -= 1
        now = time.perf_counter()
        episode = task.result()[0]
        # Each turn's end time, from the episode's start and the turns' latencies (tool time
        # is negligible here): turns are counted where they happened, so a long episode that
        # straddles the window edge is counted fairly and overloaded rows are not undercounted.
        at = now - episode.duration_s
        for turn in episode.turns:
            at += turn.latency_s
            if w0 <= at <= w1:
                turns += 1
        if w0 <= now <= w1:
            episodes += 1
        if now < w1:
            spawn()
        elif outstanding == 0 and not finished.done():
            finished.set_result(None)

    def mark(key: str) -> None:
        cpu[key] = time.process_time()

    loop.call_at(loop.time() + warmup, mark, "start")
    loop.call_at(loop.time() + warmup + window, mark, "end")
    for _ in range(in_flight + max(4, in_flight // 8)):  # a few queued beyond the slots: never idle
        spawn()
    await finished
    await worker.close()
    return {"turns": turns, "episodes": episodes, "cpu_s": cpu["end"] - cpu["start"], "window_s": window}


def _worker_main(root: str, in_flight: int, warmup: float, window: float, share: int, of: int,
                 ready: Any, go: Any, out: Any) -> None:
    out.put(asyncio.run(_drive(root, in_flight, warmup, window, share, of, ready, go)))


def _one(sim: SimProcess, workers: int, in_flight: int, warmup: float, window: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    go = ctx.Event()
    readies = [ctx.Event() for _ in range(workers)]
    procs = [ctx.Process(target=_worker_main, args=(sim.root, in_flight, warmup, window, i, workers,
                                                    readies[i], go, out)) for i in range(workers)]
    for p in procs:
        p.start()
    for ev in readies:
        if not ev.wait(120):
            raise RuntimeError("a worker did not get ready")
    srv0 = sim.cpu_s()
    go.set()
    time.sleep(warmup)
    srv1 = sim.cpu_s()
    time.sleep(window)
    srv2 = sim.cpu_s()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    del srv0
    turns = sum(r["turns"] for r in results)
    bound = workers * in_flight / LAT_MEAN_S
    achieved = turns / window
    client_ms = 1000 * sum(r["cpu_s"] for r in results) / max(turns, 1)
    server_ms = 1000 * (srv2 - srv1) / max(turns, 1)
    # What 2 cores could do at the measured CPU per turn (client + simulator), had they been
    # ours alone: the machine's own bound, next to Little's.
    cpu_bound = (os.cpu_count() or 1) * 1000 / (client_ms + server_ms) if turns else float("nan")
    return {"workers": workers, "in_flight_per_worker": in_flight, "turns_per_s": achieved,
            "littles_bound": bound, "x_of_bound": achieved / bound,
            "cpu_bound": cpu_bound, "x_of_min_bound": achieved / min(bound, cpu_bound),
            "server_cpu_ms_per_turn": server_ms,
            "client_cpu_ms_per_turn": client_ms,
            "client_cpu_util_per_worker": median([r["cpu_s"] / window for r in results]),
            "server_cpu_util": (srv2 - srv1) / window}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--in-flight", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--warmup", type=float, default=1.5)
    p.add_argument("--window", type=float, default=4.0)
    args = p.parse_args(argv)
    if args.quick:
        args.in_flight, args.workers, args.warmup, args.window = [8], [1], 0.3, 0.6
    args.rounds = args.rounds or 1
    rows = []
    with SimProcess() as sim:
        for rnd in range(args.rounds):
            for workers in args.workers:
                for n in args.in_flight:
                    row = _one(sim, workers, n, args.warmup, args.window)
                    rows.append({"round": rnd, **row})
                    print(f"  workers={workers} in_flight={n}: {row['turns_per_s']:.0f} turns/s "
                          f"({row['x_of_bound']:.2f} of {row['littles_bound']:.0f})", flush=True)
    summary = []
    for workers in args.workers:
        for n in args.in_flight:
            mine = [r for r in rows if r["workers"] == workers and r["in_flight_per_worker"] == n]
            summary.append({k: (median([r[k] for r in mine]) if isinstance(mine[0][k], float) else mine[0][k])
                            for k in mine[0] if k != "round"})
    notes = [f"bench-lat mean latency {1000 * LAT_MEAN_S:.1f} ms; bound = workers x in_flight / mean latency",
             "target: >= 0.9 of the bound at 256 in flight per worker"]
    return report(NAME, "Concurrency: achieved turns/s vs Little's-law bound", args, rows, summary, notes)


if __name__ == "__main__":
    main()
