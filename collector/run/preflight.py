"""Before any episode: keys, reachability, the served model, the cluster's room (tests:
tests/run/test_worker.py for `probe`, tests/run/test_job.py and tests/faults/test_bad_input.py
for the checks as a run meets them).

Each check answers in one line (a `ConfigError`) before the sweep starts, instead of a run
of error episodes or a wait without end:

- keys: every provider's `api_key_env` is set (`collector.run.endpoints.read_api_key`);
- reachability: each base URL accepts a connection the way requests go (`probe`);
- the served model is the asked one (`collector.run.modelcheck`);
- the cluster fits the workers (`check_cluster_fits`): Ray would otherwise queue an actor
  it cannot place and wait for room forever.

A local run checks keys, reachability and models once in the driver, before Ray starts
(5-10 s); the workers check keys and reachability again in their own environment, and on a
remote cluster (where the driver may have no route to the providers) the served models too.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from urllib.parse import urlsplit

import httpx

from collector.config import ProviderConfig, RunConfig
from collector.errors import ConfigError
from collector.run.endpoints import read_api_key, safe_url
from collector.run.modelcheck import check_models

__all__ = ["check_cluster_fits", "check_providers", "probe"]

#: How long the start-up reachability probe waits for a TCP connection.
PROBE_TIMEOUT_S = 5.0


async def check_providers(providers: Sequence[ProviderConfig], base_urls: Sequence[str],
                          models: Sequence[str], where: str, *, served_models: bool = True) -> None:
    """Keys present, every base URL reachable (an empty URL is skipped: a simulator not yet
    started), and, with `served_models`, each swept name served as asked; `where` says where
    the check ran, for a missing variable."""
    for provider in providers:
        read_api_key(provider, where)
    routes = {(url, p.http_client) for p, url in zip(providers, base_urls, strict=True) if url}
    for url, client in sorted(routes):
        await probe(url, http_client=client)
    if served_models:
        await check_models(providers, base_urls, models, where)


def check_cluster_fits(cfg: RunConfig, cpus: float, largest_node: float) -> None:
    """Raise a one-line ConfigError unless a cluster of `cpus` CPUs (`largest_node` on its
    biggest live node) can hold every worker actor.

    Ray queues an actor it cannot place and waits for room forever; this turns the common
    case (too many CPUs asked per worker) into an error before any actor is created. The
    largest node must also hold one worker: CPUs are not pooled across nodes.
    """
    per_worker = cfg.ray.cpus_per_worker
    if per_worker <= 0:
        return
    need = cfg.ray.workers * per_worker
    if need > cpus + 1e-9 or per_worker > largest_node + 1e-9:
        raise ConfigError(
            f"ray.workers x ray.cpus_per_worker = {cfg.ray.workers} x {per_worker:g} = {need:g} CPUs, "
            f"but the cluster has {cpus:g} CPUs (largest node {largest_node:g}); lower ray.cpus_per_worker "
            "or ray.workers"
        )


def _port_of(url: str) -> int:
    """The URL's port (the scheme's default when absent); a one-line ConfigError when invalid."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        text = parts.netloc.rpartition("@")[2].rpartition(":")[2]
        why = "out of range (0-65535)" if text.isdigit() else "not a number"
        raise ConfigError(f"provider.base_url: {safe_url(url)}: port {text!r} is {why}") from None
    return port or (443 if parts.scheme == "https" else 80)


async def probe(url: str, timeout_s: float = PROBE_TIMEOUT_S, *, http_client: str = "fast") -> None:
    """Raise a one-line ConfigError unless the URL's server can be reached the way requests go.

    Cheap on purpose (no key spent): it catches the common mistakes (wrong host, wrong
    port, server not started) before any episode runs, instead of a sweep of error
    episodes. What a reachable server then says is the episodes' business. The default
    transport connects directly, so a TCP connection is the test. With `http_client =
    "httpx"` the requests may go through a proxy (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY,
    NO_PROXY), where a direct connection proves nothing: the probe is then one request by
    httpx with the same proxy settings, and any HTTP answer (even a 404) passes.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"provider.base_url: not an http(s) URL: {safe_url(url)}")
    port = _port_of(url)
    if http_client == "httpx":
        await _probe_by_request(url, timeout_s)
        return
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), timeout_s)
    except (OSError, TimeoutError) as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
        if isinstance(exc, socket.gaierror):
            reason = "unknown host"
        raise ConfigError(f"provider.base_url: {safe_url(url)} is unreachable ({reason})") from None
    writer.close()
    await writer.wait_closed()


async def _probe_by_request(url: str, timeout_s: float) -> None:
    """One GET of `url` by httpx honouring the proxy variables; the body is never read."""
    target = safe_url(url)  # no user info: nothing of a credential is sent by the probe
    try:
        async with (
            httpx.AsyncClient(trust_env=True, timeout=timeout_s) as client,
            client.stream("GET", target),
        ):
            pass
    except httpx.HTTPError as exc:
        via = " (through the proxy from the environment)" if isinstance(exc, httpx.ProxyError) else ""
        reason = "timed out" if isinstance(exc, httpx.TimeoutException) else type(exc).__name__
        raise ConfigError(f"provider.base_url: {target} is unreachable{via} ({reason})") from None
