"""The engine's own load, read from its Prometheus `/metrics`: a signal for adaptive admission.

Latency and refusals tell the client the server is full only once requests already wait or
are turned away. A GPU server says so earlier: vLLM and SGLang publish how many requests
they run and queue, how full the KV cache is and (vLLM) how many sequences they had to
preempt. With `provider.server_metrics = "vllm"` or `"sglang"` and `ray.admission =
"adaptive"`, each worker's gate for that provider scrapes the endpoint (at most once per
`SCRAPE_INTERVAL_S`, piggybacked on finished requests: an idle run scrapes nothing) and
feeds what it reads to the AIMD controller (`collector.run.admission.AimdController.server_load`):

- overloaded, one multiplicative decrease per scrape at most: the preemption counter rose
  since the last scrape (the engine evicted a sequence and recomputes it: more in flight
  costs throughput), or the queue stood at `QUEUE_HOLD` x the running requests or more on
  two scrapes in a row without shrinking (the engine cannot take what is sent);
- full, no increase until a scrape says otherwise: that many requests waiting, or the KV
  cache at `KV_FULL` or more (the next sequences would wait or preempt);
- otherwise nothing changes: the latency and status signals rule as before.

Names read (from vLLM's `vllm/v1/metrics/loggers.py` and SGLang's `srt/metrics/collector.py`;
each metric is summed over its label sets, engines and models alike, except usage, the
largest): vLLM `vllm:num_requests_waiting`, `vllm:num_requests_running`,
`vllm:kv_cache_usage_perc` (before v0.10 `vllm:gpu_cache_usage_perc`),
`vllm:num_preemptions_total`; SGLang `sglang:num_queue_reqs`, `sglang:num_running_reqs`,
`sglang:token_usage` (no preemption counter is published).

A scrape that fails (refused, timed out, not Prometheus text, none of the names) changes
nothing and is counted (`MetricsReader.failures`); after `MAX_FAILURES` in a row the reader
stops for the run with one warning, so a server without the endpoint costs a few requests,
never the run. The endpoint (`provider.metrics_url`, default the base URL's root +
`/metrics`) is fetched with the provider's own headers: vLLM's `--api-key` does not guard
`/metrics`, a gateway may.

Tests: tests/run/test_servermetrics.py.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import httpx

from collector.config import ProviderConfig
from collector.config.urls import public_url
from collector.providers.base import Endpoint, basic_authorization

__all__ = ["EngineLoad", "LoadVerdict", "MetricsReader", "ServerKind", "metrics_reader", "parse_load"]

log = logging.getLogger(__name__)

ServerKind = Literal["vllm", "sglang"]
SCRAPE_INTERVAL_S = 1.0
SCRAPE_TIMEOUT_S = 2.0
"""Bound on one scrape (the endpoint answers from memory; a slow one is a failed scrape)."""
MAX_METRICS_BYTES = 4 * 1024 * 1024
"""A longer `/metrics` body is a failed scrape, not read whole."""
"""Least time between two scrapes of one gate (vLLM refreshes its gauges every step)."""
QUEUE_HOLD = 0.5
"""Waiting requests, as a share of the running ones, from which the engine is taken as full.
A short queue is wanted: it keeps every slot busy while finished requests' episodes run
their tools; a long one is only latency."""
KV_FULL = 0.95
"""KV-cache usage from which the engine is taken as full (no increase)."""
MAX_FAILURES = 5
"""Failed scrapes in a row after which a reader stops for the run."""

_NAMES: dict[ServerKind, dict[str, tuple[str, ...]]] = {
    "vllm": {
        "waiting": ("vllm:num_requests_waiting",),
        "running": ("vllm:num_requests_running",),
        "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    },
    "sglang": {
        "waiting": ("sglang:num_queue_reqs",),
        "running": ("sglang:num_running_reqs",),
        "kv_usage": ("sglang:token_usage",),
        "preemptions": (),
    },
}

# One exposition-format sample: name, optional {labels}, value (timestamp ignored).
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What one scrape says; None where the server publishes no such metric."""

    waiting: float | None
    running: float | None
    kv_usage: float | None
    preemptions: float | None


def _samples(text: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(2))
        except ValueError:
            continue
        if math.isfinite(value):
            out.setdefault(m.group(1), []).append(value)
    return out


def parse_load(text: str, kind: ServerKind) -> EngineLoad | None:
    """The engine's load from Prometheus text, or None when none of `kind`'s names is in it."""
    samples = _samples(text)

    def pick(field: str, combine: Callable[[list[float]], float]) -> float | None:
        for name in _NAMES[kind][field]:
            if name in samples:
                return combine(samples[name])
        return None

    load = EngineLoad(pick("waiting", sum), pick("running", sum), pick("kv_usage", max),
                      pick("preemptions", sum))
    if load == EngineLoad(None, None, None, None):
        return None
    return load


@dataclass(frozen=True, slots=True)
class LoadVerdict:
    """What the controller does with one scrape: cut (`overloaded`) or hold (`full`)."""

    overloaded: bool
    full: bool
    reason: str


class MetricsReader:
    """Judges scrapes of one engine against the one before (counters are cumulative).

    `fetch` returns the endpoint's text or raises; the reader catches everything it raises,
    so a broken endpoint never reaches the request that triggered the scrape."""

    def __init__(self, kind: ServerKind, fetch: Callable[[], Awaitable[str]], where: str) -> None:
        self.kind = kind
        self._fetch = fetch
        self._where = where
        self._previous: EngineLoad | None = None
        self.failures = 0
        """Failed scrapes in a row."""
        self.stopped = False
        self.scrapes = 0
        self.verdicts: Counter[str] = Counter()
        """Verdicts by reason, for tests and debugging."""

    def judge(self, load: EngineLoad) -> LoadVerdict:
        """The verdict on `load` given the previous scrape (see the module docstring)."""
        before, self._previous = self._previous, load
        if (before is not None and load.preemptions is not None and before.preemptions is not None
                and load.preemptions > before.preemptions):
            return LoadVerdict(True, True, "preempted")
        waiting = load.waiting or 0.0
        bound = max(1.0, QUEUE_HOLD * (load.running or 0.0))
        if (waiting >= bound and before is not None and (before.waiting or 0.0) >= bound
                and waiting >= (before.waiting or 0.0)):
            return LoadVerdict(True, True, "queue not draining")
        if waiting >= bound:
            return LoadVerdict(False, True, "queued")
        if load.kv_usage is not None and load.kv_usage >= KV_FULL:
            return LoadVerdict(False, True, "kv cache full")
        return LoadVerdict(False, False, "room")

    async def scrape(self) -> LoadVerdict | None:
        """One scrape and its verdict; None when it failed or the reader has stopped."""
        if self.stopped:
            return None
        self.scrapes += 1
        try:
            load = parse_load(await self._fetch(), self.kind)
        except Exception:  # noqa: BLE001 - any failure of the endpoint is only a missing signal
            load = None
        if load is None:
            self.failures += 1
            if self.failures >= MAX_FAILURES:
                self.stopped = True
                log.warning("server metrics at %s: %d scrapes in a row failed or held no %s metrics; "
                            "admission goes on without them", self._where, self.failures, self.kind)
            return None
        self.failures = 0
        verdict = self.judge(load)
        self.verdicts[verdict.reason] += 1
        return verdict


def default_metrics_url(base_url: str) -> str:
    """vLLM and SGLang serve `/metrics` at the root, beside `/v1`."""
    root = base_url.rstrip("/")
    return (root[: -len("/v1")] if root.endswith("/v1") else root) + "/metrics"


def metrics_reader(config: ProviderConfig, endpoint: Endpoint,
                   client: httpx.AsyncClient) -> MetricsReader | None:
    """The reader of `config.server_metrics` (None when off), fetching through `client` (not
    the admission gate's: a scrape is not a model request) with the provider's credentials."""
    if config.server_metrics == "none":
        return None
    url = config.metrics_url or default_metrics_url(endpoint.base_url)
    headers: dict[str, str] = {}
    if endpoint.api_key:
        headers["authorization"] = f"Bearer {endpoint.api_key}"
    elif endpoint.basic_auth is not None:  # the base URL's user info, moved out of it
        headers["authorization"] = basic_authorization(*endpoint.basic_auth)
    params = dict(endpoint.query) if endpoint.query and config.metrics_url is None else None

    async def fetch() -> str:
        async with client.stream("GET", url, headers=headers, params=params,
                                 timeout=SCRAPE_TIMEOUT_S) as reply:
            reply.raise_for_status()
            body = b""
            async for chunk in reply.aiter_bytes():
                body += chunk
                if len(body) > MAX_METRICS_BYTES:
                    raise ValueError("metrics body too large")
            return body.decode("utf-8", "replace")

    return MetricsReader(config.server_metrics, fetch, public_url(url))
