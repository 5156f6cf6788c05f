"""The episodes every client-side benchmark runs, and the clients they are compared with.

One workload for all: the built-in `support_desk` environment (refunds, approvals, ticket
closing, e-mails, lookups; two to four turns an episode) against the simulator's
`bench-zero` / `bench-lat` models over Chat Completions, non-streaming, per-turn cap 256.

The comparison loops send *the same requests*: `record_bodies` runs the collector once
with a recording client and keeps each episode's request bodies, byte for byte; the bare
loops replay them (one episode = its bodies in order, each sent after the previous reply),
so server work, bytes on the wire and turns per episode are identical between variants.
"""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from collector.config import RunConfig, config_fingerprint, config_from_dict, resolved_config
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers import base_url_for, build_provider
from collector.providers.transport import fast_client
from collector.record.episode import Episode
from collector.run.plan import WorkItem, load_env, plan_work
from collector.run.worker import EpisodeWorker, WorkerSetup, endpoint_for, sampling_params
from collector.storage.local import LocalRunStore

BUDGET = 256
#: The layout the worker used before StreamTransport: many small httpcore clients of this
#: many connections each (runtime-notes' best httpcore layout). Kept as a measured variant.
CLIENT_SLOTS = 8


def make_config(model: str, episodes: int, in_flight: int, num_tasks: int = 120) -> RunConfig:
    """A config whose plan holds at least `episodes` episodes of one model at one budget."""
    samples = max(1, math.ceil(episodes / num_tasks))
    return config_from_dict({
        "name": "bench", "seed": 0, "samples_per_task": samples,
        "provider": {"kind": "sim", "sim_transport": "chat"},
        "sweep": {"models": [model], "budgets": [BUDGET]},
        "env": {"name": "support_desk", "options": {"num_tasks": num_tasks}},
        "loop": {"stop_on": ["length", "malformed_tool_call"], "max_steps": 6},
        "ray": {"workers": 1, "episodes_in_flight": in_flight},
        "output": {"path": "unused", "format": "arrow"},
    })


def items_for(cfg: RunConfig, episodes: int) -> list[WorkItem]:
    return plan_work(cfg).items[:episodes]


def worker_for(cfg: RunConfig, sim_root: str) -> EpisodeWorker:
    """The collector's own worker (no Ray around it), pointed at the simulator."""
    return EpisodeWorker(WorkerSetup(cfg, "bench", (base_url_for("chat", sim_root),), "bench"))


async def record_bodies(cfg: RunConfig, items: Sequence[WorkItem], sim_root: str) -> list[list[bytes]]:
    """Each episode's request bodies, as the collector sends them (one episode at a time)."""
    env = load_env(cfg)
    tasks = {t.id: t for t in env.tasks()}
    endpoint = endpoint_for(cfg.provider, base_url_for("chat", sim_root), None)
    current: list[bytes] = []

    async def hook(request: httpx.Request) -> None:
        current.append(request.content)

    out: list[list[bytes]] = []
    async with httpx.AsyncClient(event_hooks={"request": [hook]}) as client:
        provider = build_provider("chat", endpoint, client)
        sem = asyncio.Semaphore(1)
        for item in items:
            async with sem:
                current = []
                spec = EpisodeSpec(run_id="bench", model=item.model, provider_kind="sim", budget=item.budget,
                                   task=tasks[item.task_id], sample=item.sample, seed=item.seed,
                                   episode_id=item.episode_id, sampling=sampling_params(cfg))
                await run_episode(spec, provider, env, cfg.loop)
                out.append(current)
    return out


def commit(cfg: RunConfig, episodes: Sequence[Episode], tmp: str) -> None:
    """What the driver does with returned episodes: one transaction of shards into a run dir."""
    with LocalRunStore.open(Path(tmp) / "run", config_fingerprint(cfg), resolved_config(cfg),
                            cfg.output.format, cfg.output.rows_per_shard) as store:
        store.commit(episodes)


async def run_collector(cfg: RunConfig, items: Sequence[WorkItem], sim_root: str,
                        with_shards: bool = True) -> tuple[int, list[Episode]]:
    """The collector path: `EpisodeWorker.run_batch` (client layout, adapter, loop, record),
    then the shard commit. Returns (turns, episodes)."""
    worker = worker_for(cfg, sim_root)
    try:
        await worker.ready()
        episodes = await worker.run_batch(items)
    finally:
        await worker.close()
    if with_shards:
        with tempfile.TemporaryDirectory() as tmp:
            commit(cfg, episodes, tmp)
    return sum(len(e.turns) for e in episodes), episodes


async def _replay(bodies: Sequence[list[bytes]], in_flight: int, clients: Sequence[httpx.AsyncClient],
                  url: str, per_client: int, request_timeout: Any) -> int:
    """Constant `in_flight` episodes; slot i uses client i // per_client; returns turns sent."""
    queue = deque(bodies)
    headers = {"content-type": "application/json"}
    turns = 0

    async def slot(i: int) -> None:
        nonlocal turns
        client = clients[min(i // per_client, len(clients) - 1)]
        while queue:
            episode = queue.popleft()
            for body in episode:
                response = await client.post(url, content=body, headers=headers, timeout=request_timeout)
                if response.status_code != 200:
                    raise RuntimeError(f"status {response.status_code}")
                response.json()
                turns += 1

    await asyncio.gather(*(slot(i) for i in range(in_flight)))
    return turns


async def run_bare_httpcore_split(bodies: Sequence[list[bytes]], in_flight: int, sim_root: str) -> int:
    """A bare loop over httpcore's best layout: ceil(n/8) default-transport clients of 8 connections."""
    n = math.ceil(in_flight / CLIENT_SLOTS)
    limits = httpx.Limits(max_connections=CLIENT_SLOTS, max_keepalive_connections=CLIENT_SLOTS)
    clients = [httpx.AsyncClient(limits=limits, timeout=None) for _ in range(n)]
    try:
        return await _replay(bodies, in_flight, clients, base_url_for("chat", sim_root) + "/chat/completions",
                             CLIENT_SLOTS, 60.0)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


async def run_plain_httpx(bodies: Sequence[list[bytes]], in_flight: int, sim_root: str) -> int:
    """A plain loop over one `httpx.AsyncClient()` with default settings (the common set-up)."""
    # Default limits (100 connections); a 60 s timeout instead of 5 s only so that a slow
    # round on a loaded machine fails no request (a pool wait counts against the timeout).
    async with httpx.AsyncClient(timeout=60.0) as client:
        url = base_url_for("chat", sim_root) + "/chat/completions"
        return await _replay(bodies, in_flight, [client], url, in_flight, httpx.USE_CLIENT_DEFAULT)


async def run_bare_same_setup(bodies: Sequence[list[bytes]], in_flight: int, sim_root: str) -> int:
    """A bare loop over the worker's client set-up: `fast_client()` (httpx on `StreamTransport`)."""
    async with fast_client() as client:
        url = base_url_for("chat", sim_root) + "/chat/completions"
        return await _replay(bodies, in_flight, [client], url, in_flight, 60.0)


async def run_bare_raw_streams(bodies: Sequence[list[bytes]], in_flight: int, sim_root: str) -> int:
    """The floor: hand-written HTTP/1.1 over asyncio streams, one connection per slot, no httpx."""
    host, port = sim_root.removeprefix("http://").split(":")
    queue = deque(bodies)
    turns = 0
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
            "content-type: application/json\r\ncontent-length: ").encode()

    async def slot() -> None:
        nonlocal turns
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while queue:
                for body in queue.popleft():
                    writer.write(head + str(len(body)).encode() + b"\r\n\r\n" + body)
                    status_and_headers = await reader.readuntil(b"\r\n\r\n")
                    length = 0
                    for line in status_and_headers.split(b"\r\n"):
                        if line[:15].lower() == b"content-length:":
                            length = int(line[15:])
                    if not status_and_headers.startswith(b"HTTP/1.1 200"):
                        raise RuntimeError("not a 200")
                    json.loads(await reader.readexactly(length))
                    turns += 1
        finally:
            writer.close()

    await asyncio.gather(*(slot() for _ in range(in_flight)))
    return turns
