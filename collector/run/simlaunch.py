"""Base URLs for a run, starting the simulated provider when the config asks for it.

A provider of kind "sim" needs no key and no server of the user's: the run starts one
`collector.sim.server.SimServer` on a free loopback port (seeded with the run seed, so a
rerun sees the same model behaviour), hands its URL to the workers and stops it when the
run ends. It runs in a background thread of the driver process, which is otherwise idle,
so on a small machine the simulator gets a process of its own.

Loopback only: Ray workers on the driver's node reach it; workers on other nodes cannot.
A multi-node sweep is for real providers (or for a simulator the user serves with
`collector sim --host 0.0.0.0` and names as a `chat` provider's base_url).

Tests: tests/run/test_worker.py, tests/run/test_reasoning_sweep.py (and every job test of a
"sim" provider).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

from collector.config import ProviderConfig
from collector.providers import base_url_for


@contextmanager
def provider_urls(providers: Sequence[ProviderConfig], seed: int) -> Iterator[tuple[str, ...]]:
    """Yield one base URL per provider; a simulator is started (once) for the "sim" ones."""
    with ExitStack() as stack:
        sim_url: str | None = None
        urls: list[str] = []
        for provider in providers:
            if provider.kind != "sim":
                assert provider.base_url is not None  # the config validator requires it
                urls.append(provider.base_url)
                continue
            if sim_url is None:
                from collector.sim.server import SimServer

                sim_url = stack.enter_context(SimServer(seed=seed)).base_url
            # The simulator serves every wire at its root; each adapter wants its SDK's form.
            urls.append(base_url_for(provider.wire, sim_url))
        yield tuple(urls)
