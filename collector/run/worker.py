"""The episode worker: runs many episodes at once with plain asyncio. No Ray in here.

`collector.run.cluster` wraps `EpisodeWorker` in a Ray async actor; tests drive it directly in
an event loop. Everything heavy is built inside the worker process on first use (the
environment, the HTTP clients, the provider adapters), never pickled across Ray.

Concurrency. The worker holds `episodes_in_flight` slots. Every episode takes a slot for
its whole life and gives it back when it ends, so the number in flight stays constant as
long as work is queued: the driver keeps more than one batch outstanding per worker, and
episodes of the next batch take slots as soon as episodes of the previous one free them
(no waves; runtime-notes: waves reached 0.68 of the bound, refilled slots 0.96).

HTTP client. By default one `httpx.AsyncClient` over
`collector.providers.transport.StreamTransport` serves every slot (`provider.http_client =
"httpx"` selects httpx's own transport, for proxies, split over small clients: see
`http_clients`). httpx's default transport (httpcore) degrades under hundreds of
concurrent requests (runtime-notes: its pool does work proportional to connections x queued
requests) and costs 1.4-1.8 ms of client CPU per turn even split into many small clients;
StreamTransport opens a connection whenever none is idle, does O(1) pool work per request,
and costs about 0.4 ms per turn (bench/overhead.py, BENCHMARKS.md). The slots bound the
connections: at most `episodes_in_flight` per worker.

Admission. With `ray.admission = "adaptive"` each (provider, model) pair gets its own client
whose transport passes every request through an `collector.run.admission.Admission`: the
slots stay at `episodes_in_flight` (the ceiling), and the requests they send wait there for
what the server takes. The gauges (`admission_gauges`) ride on `finished`, which the driver
polls, under `admission.*` keys that `collector.run.progress.LiveCounts` sets apart.

Secrets. The API key is read here, from the variable the config names, in the worker's
own environment: it never crosses Ray and never enters a log, an episode or an error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from collector.config import ProviderConfig, RunConfig
from collector.envs.base import Environment, Task
from collector.errors import ConfigError
from collector.harness.env import check_harness_config, harness_of
from collector.harness.gateway import Gateway, GatewayServer
from collector.harness.runner import run_harness_episode
from collector.providers.base import Endpoint, Provider
from collector.providers.transport import StreamTransport, fast_client
from collector.record.episode import Episode
from collector.run.admission import Admission, AdmissionTransport, admission_gauges
from collector.run.encoded import EncodedBatch, encode_batch
from collector.run.endpoints import endpoint_for, read_api_key
from collector.run.plan import WorkItem, load_env, select_tasks
from collector.run.policyversion import DeclaredVersion, VersionedProvider, declared_version
from collector.run.preflight import check_providers
from collector.run.servermetrics import metrics_reader
from collector.run.worker_writes import WrittenBatch, write_kept
from collector.storage.location import is_uri
from collector.storage.pending import ShardSink
from collector.turn import SamplingParams

# endpoint_for: also imported from here by the benches that drive a worker by hand.
__all__ = ["EpisodeWorker", "WorkerSetup", "endpoint_for", "http_clients", "sampling_params"]

@dataclass(slots=True, frozen=True)
class WorkerSetup:
    """What a worker needs, picklable: the config and the resolved base URL per provider."""

    cfg: RunConfig
    run_id: str
    base_urls: tuple[str, ...]
    """Per entry of `Plan.providers`; for the simulator, the loopback URL of this run's server."""
    name: str = "worker"
    check_models: bool = False
    """Check the served models here (`collector.run.modelcheck`): on a remote cluster, where
    the driver may have no route to the providers; a local run checks once, in the driver."""
    sink: ShardSink | None = None
    """Where this worker writes its batches' shards (`output.worker_writes`, `write_batch`);
    None: it returns its batches to the driver as encoded rows (`encode_batch`)."""


class EpisodeWorker:
    """Runs batches of work items; many episodes concurrently, each in its own slot."""

    def __init__(self, setup: WorkerSetup) -> None:
        self.setup = setup
        self.cfg = setup.cfg
        self.node = socket.gethostname()
        """Stored as each episode's `node`; a Ray actor adds its node id (`collector.run.cluster`)."""
        self.in_flight = self.cfg.ray.episodes_in_flight
        self._init_lock: asyncio.Lock | None = None
        self._ready = False
        self._env: Environment | None = None
        self._tasks: dict[str, Task] = {}
        self._clients: list[httpx.AsyncClient] = []
        self._providers: dict[tuple[int, int], Provider] = {}
        self._declared: dict[int, DeclaredVersion | None] = {}
        """Per provider: its declared-version reader, shared by its clients (one file stamp)."""
        self._endpoints: list[Endpoint] = []
        self._credentials: tuple[str, ...] = ()
        self._extra_bodies: list[dict[str, object]] = []
        """Per provider: `sampling.extra_body` with its own `extra_body` over it (merged once)."""
        self._slots: asyncio.Queue[int] | None = None
        self.episodes_run = 0
        self._finished: Counter[str] = Counter()
        self._gates: dict[object, Admission] = {}
        """Adaptive admission: one gate per (provider index, model), built on first use."""
        self._gated: dict[tuple[int, str], Provider] = {}
        self._gateway: GatewayServer | None = None
        """With `env.name = "harness"`: the model endpoint this worker's harnesses call."""

    @property
    def finished(self) -> Counter[str]:
        """Stop reasons of every episode this worker finished, returned or not: the driver polls
        it for the progress line, which would otherwise move only when a whole batch returns.
        With adaptive admission, the gates' gauges too, under `admission.*` keys."""
        if not self._gates:
            return self._finished
        return Counter({**self._finished, **admission_gauges(self._gates)})

    async def ready(self) -> str:
        """Build everything and check keys and reachability; return the worker's name."""
        if self._init_lock is None:
            self._init_lock = asyncio.Lock()
        async with self._init_lock:
            if not self._ready:
                await self._build()
                self._ready = True
        return self.setup.name

    async def _build(self) -> None:
        cfg = self.cfg
        where = f"on worker {self.setup.name}, host {socket.gethostname()}"
        providers = list(cfg.sweep.providers) if cfg.sweep.providers else [cfg.provider]
        self._endpoints = [
            endpoint_for(p, url, read_api_key(p, where))
            for p, url in zip(providers, self.setup.base_urls, strict=True)
        ]
        # Any credential of the run, not only the episode's own provider's, is kept out of
        # every record.
        self._credentials = tuple(dict.fromkeys(c for e in self._endpoints for c in e.credentials))
        self._extra_bodies = [p.request_extra_body(cfg.sampling.extra_body) for p in providers]
        await check_providers(providers, self.setup.base_urls, cfg.sweep.models, where,
                              served_models=self.setup.check_models)
        if self.setup.sink is not None and not self.setup.sink.reachable():
            if is_uri(cfg.output.path):
                raise ConfigError(
                    f"output.path {cfg.output.path}: the run is not visible {where} (workers write "
                    "its shards: give them the same AWS credentials and endpoint as the driver)"
                )
            root = getattr(self.setup.sink, "root", cfg.output.path)
            raise ConfigError(
                f"output.worker_writes: the run dir {root} is not there {where}; workers write into "
                "a local output.path only if it is a shared filesystem mounted at the same path on "
                "every node (else set output.worker_writes = false)"
            )
        self._env = load_env(cfg)
        # The environment's own secrets (an MCP server's pass_env values, credentials in its
        # URL) are kept out of every record like the providers' keys.
        self._credentials = tuple(dict.fromkeys((*self._credentials, *self._env.credentials())))
        self._tasks = {t.id: t for t in select_tasks(cfg, self._env)}
        harness = harness_of(self._env)
        if harness is not None:
            check_harness_config(cfg, harness)
            self._gateway = GatewayServer(Gateway(), harness.settings.host)
            await self._gateway.start()
        if cfg.ray.admission == "adaptive":
            slow = [p.name for p in providers if p.http_client != "fast"]
            if slow:
                raise ConfigError(
                    f"ray.admission = \"adaptive\" needs provider.http_client = \"fast\" "
                    f"(provider {slow[0]} has \"httpx\"); set ray.admission = \"static\""
                )
        self._clients = http_clients(providers, self.in_flight)
        self._slots = asyncio.Queue()
        for slot in range(self.in_flight):
            self._slots.put_nowait(slot)

    def _provider(self, index: int, client_index: int) -> Provider:
        key = (index, client_index)
        provider = self._providers.get(key)
        if provider is None:
            from collector.providers import build_provider

            config = (self.cfg.sweep.providers or [self.cfg.provider])[index]
            client = self._clients[client_index]
            kind: str = config.wire
            if self.cfg.sampling.token_in:  # the token endpoints of the same server (chat wire)
                kind = "token_in"
            provider = build_provider(kind, self._endpoints[index], client)
            declared = self._declared.setdefault(index, declared_version(config))
            if declared is not None:  # the run declares the policy version (issue 27)
                provider = VersionedProvider(provider, declared, client)
            self._providers[key] = provider
        return provider

    def _gated_provider(self, index: int, model: str) -> Provider:
        """The provider of (provider, model) behind its own admission gate and client."""
        key = (index, model)
        provider = self._gated.get(key)
        if provider is None:
            from collector.providers import build_provider

            config = (self.cfg.sweep.providers or [self.cfg.provider])[index]
            # Declared budgets are split evenly over the workers (collector.run.admission).
            share = self.cfg.ray.workers
            endpoint = self._endpoints[index]
            gate = Admission(
                self.in_flight,
                config.requests_per_minute / share if config.requests_per_minute else None,
                config.tokens_per_minute / share if config.tokens_per_minute else None,
                # The engine's /metrics, read through an ungated client: a scrape is no model call.
                metrics=metrics_reader(config, endpoint, self._clients[0]),
            )
            client = fast_client(AdmissionTransport(StreamTransport(), gate))
            self._clients.append(client)
            self._gates[key] = gate
            # The same provider `_provider` builds (token-in, a declared policy version), gated.
            kind: str = "token_in" if self.cfg.sampling.token_in else config.wire
            provider = build_provider(kind, endpoint, client)
            declared = self._declared.setdefault(index, declared_version(config))
            if declared is not None:  # its version URL fetched ungated, like the metrics
                provider = VersionedProvider(provider, declared, self._clients[0])
            self._gated[key] = provider
        return provider

    async def run_batch(self, items: Sequence[WorkItem]) -> list[Episode]:
        """Run every item (concurrently, within the worker's slots) and return the episodes."""
        await self.ready()
        return list(await asyncio.gather(*(self._run_one(item) for item in items)))

    async def encode_batch(self, items: Sequence[WorkItem]) -> EncodedBatch:
        """Run every item and return the episodes as shard rows, for the driver to commit
        (`collector.run.encoded`). Encoded on the loop: ~40 µs of CPU an episode, less than a
        thread hop would cost."""
        return encode_batch(await self.run_batch(items))

    async def write_batch(self, items: Sequence[WorkItem]) -> WrittenBatch:
        """Run every item, write the kept episodes as pending shards through the setup's sink
        (one per cell, in a thread: the loop keeps serving the other slots) and return what
        the driver commits (`collector.run.worker_writes`)."""
        assert self.setup.sink is not None, "write_batch needs a WorkerSetup with a sink"
        episodes = await self.run_batch(items)
        return await asyncio.to_thread(write_kept, self.setup.sink, episodes)

    async def _run_one(self, item: WorkItem) -> Episode:
        from collector.episode.loop import EpisodeSpec, run_episode

        assert self._slots is not None
        assert self._env is not None
        cfg = self.cfg
        providers = cfg.sweep.providers or [cfg.provider]
        sampling = sampling_params(cfg)
        # Each provider of a sweep may send request fields of its own (`provider.extra_body`).
        sampling = dataclasses.replace(sampling, extra_body=self._extra_bodies[item.provider_index],
                                       token_ids=providers[item.provider_index].captures_token_ids(cfg.sampling))
        if providers[item.provider_index].kind == "sim":
            # The simulator's reply is a pure function of the request body, and Anthropic and
            # Responses bodies carry no seed: the sample's seed travels in a header it reads.
            sampling = dataclasses.replace(sampling, extra_headers={"x-sim-seed": str(item.seed)})
        reasoning = None
        if item.reasoning_index is not None and cfg.sweep.reasoning is not None:
            setting = cfg.sweep.reasoning[item.reasoning_index]
            reasoning = setting.label
            sampling = dataclasses.replace(
                sampling, reasoning_effort=setting.effort, thinking_budget=setting.thinking_budget
            )
        spec = EpisodeSpec(
            run_id=self.setup.run_id,
            model=item.model,
            provider_kind=providers[item.provider_index].name,
            budget=item.budget,
            task=self._tasks[item.task_id],
            sample=item.sample,
            seed=item.seed,
            episode_id=item.episode_id,
            sampling=sampling,
            env_name=cfg.env.name,
            credentials=self._credentials,
            context_window=providers[item.provider_index].context_window,
            reasoning=reasoning,
        )
        slot = await self._slots.get()
        try:
            if cfg.ray.admission == "adaptive":
                provider = self._gated_provider(item.provider_index, item.model)
            else:
                provider = self._provider(item.provider_index, slot % len(self._clients))
            harness = harness_of(self._env)
            if harness is not None and self._gateway is not None:
                episode = await run_harness_episode(spec, provider, harness, cfg.loop, self._gateway.gateway,
                                                    self._gateway.root)
            else:
                episode = await run_episode(spec, provider, self._env, cfg.loop)
        finally:
            self._slots.put_nowait(slot)
        episode.worker = self.setup.name
        episode.node = self.node
        self.episodes_run += 1
        self._finished[str(episode.stop_reason)] += 1
        return episode

    async def close(self) -> None:
        """Close the HTTP clients (the actor is about to go away)."""
        clients, self._clients = self._clients, []
        if self._gateway is not None:
            await self._gateway.stop()
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)


#: With `http_client = "httpx"`: episodes per httpx client (and its connection limit).
#: runtime-notes: one shared httpcore pool collapses under hundreds of concurrent requests;
#: many small ones do not.
HTTPX_SLOTS_PER_CLIENT = 16


def http_clients(providers: Sequence[ProviderConfig], in_flight: int) -> list[httpx.AsyncClient]:
    """The worker's HTTP clients; a slot uses client `slot % len(clients)`.

    By default one client over `StreamTransport` serves every slot (see the module
    docstring): the slots bound its connections. When any provider asks for httpx's own
    transport (a proxy is needed), the slots are split over small httpx clients instead,
    each honouring the proxy environment variables.
    """
    if all(p.http_client == "fast" for p in providers):
        return [fast_client()]
    count = max(1, -(-in_flight // HTTPX_SLOTS_PER_CLIENT))
    size = HTTPX_SLOTS_PER_CLIENT
    limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
    return [httpx.AsyncClient(limits=limits, timeout=None, trust_env=True) for _ in range(count)]


def sampling_params(cfg: RunConfig) -> SamplingParams:
    """The request parameters; `seed` stays unset so the loop sends each episode's own seed.
    Token capture as for `provider` (a sweep over providers resolves it per provider)."""
    s = cfg.sampling
    return SamplingParams(
        temperature=s.temperature,
        top_p=s.top_p,
        stop=list(s.stop) if s.stop is not None else None,
        tool_choice=s.tool_choice,
        logprobs=s.logprobs,
        top_logprobs=s.top_logprobs,
        token_ids=cfg.provider.captures_token_ids(s),
        token_in=s.token_in_server if s.token_in else None,
        extra_body=dict(s.extra_body),
        reasoning_effort=s.reasoning_effort,
        thinking_budget=s.thinking_budget,
    )
