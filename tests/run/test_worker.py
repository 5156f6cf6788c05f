"""The worker's start-up checks and its in-process episode running (no Ray)."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from collector.config import ProviderConfig, RunConfig
from collector.errors import ConfigError
from collector.record.episode import Episode
from collector.run.endpoints import read_api_key, safe_url
from collector.run.plan import plan_work
from collector.run.preflight import probe
from collector.run.simlaunch import provider_urls
from collector.run.worker import EpisodeWorker, WorkerSetup, http_clients
from collector.stop import StopReason
from tests.run.helpers import small_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def run_plan(cfg: RunConfig) -> list[Episode]:
    """Every work item of `cfg`'s plan, run by one worker in this process (no Ray)."""
    plan = plan_work(cfg)

    async def run() -> list[Episode]:
        with provider_urls(plan.providers, cfg.seed) as urls:
            worker = EpisodeWorker(WorkerSetup(cfg, plan.run_id, urls, "w"))
            try:
                return await worker.run_batch(plan.items)
            finally:
                await worker.close()

    return asyncio.run(run())


def test_missing_key_variable_is_named_not_valued(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing API-key variable is a one-line ConfigError naming the variable."""
    monkeypatch.delenv("COLLECTOR_TEST_KEY", raising=False)
    provider = ProviderConfig(kind="chat", base_url="http://x/v1", api_key_env="COLLECTOR_TEST_KEY")
    with pytest.raises(ConfigError, match=r"^provider\.api_key_env: environment variable COLLECTOR_TEST_KEY"):
        read_api_key(provider, "here")


def test_key_read_from_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key comes from the variable the config names; no variable named means no key."""
    monkeypatch.setenv("COLLECTOR_TEST_KEY", "sk-test")
    provider = ProviderConfig(kind="chat", base_url="http://x/v1", api_key_env="COLLECTOR_TEST_KEY")
    assert read_api_key(provider, "here") == "sk-test"
    assert read_api_key(ProviderConfig(kind="chat", base_url="http://x/v1"), "here") is None


def test_safe_url_drops_credentials() -> None:
    """User info in a base URL never reaches a message."""
    assert safe_url("https://user:pw@host.example:8443/v1") == "https://host.example:8443/v1"


def test_probe_unreachable_is_one_line() -> None:
    """A base URL nobody listens on is a one-line ConfigError naming the URL, before any episode."""
    url = f"http://user:secret@127.0.0.1:{free_port()}/v1"
    with pytest.raises(ConfigError) as info:
        asyncio.run(probe(url, timeout_s=2.0))
    message = str(info.value)
    assert message.startswith("provider.base_url: http://127.0.0.1:")
    assert "unreachable" in message
    assert "secret" not in message
    assert "\n" not in message


def test_probe_reachable_passes() -> None:
    """A listening server passes the probe without a request being sent."""

    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            await probe(f"http://127.0.0.1:{port}/v1")

    asyncio.run(main())


def test_probe_rejects_non_http_url() -> None:
    """A base URL that is not http(s) is refused with the field named."""
    with pytest.raises(ConfigError, match="not an http"):
        asyncio.run(probe("ftp://127.0.0.1/x"))


async def _serve_as_proxy(seen: list[bytes]) -> asyncio.Server:
    """A loopback HTTP proxy stand-in: records each request line and answers 200 `{}`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head.split(b"\r\n", 1)[0])
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.parametrize("choice", ["fast", "httpx"])
def test_http_client_choice_decides_whether_proxy_variables_are_honoured(
    monkeypatch: pytest.MonkeyPatch, choice: str
) -> None:
    """`provider.http_client = "httpx"` sends through HTTP_PROXY; the default fast transport goes direct."""
    unreachable = f"http://127.0.0.1:{free_port()}/v1/models"  # nothing listens here

    async def scenario() -> tuple[list[bytes], int | None]:
        seen: list[bytes] = []
        server = await _serve_as_proxy(seen)
        port = server.sockets[0].getsockname()[1]
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        provider = ProviderConfig(kind="chat", base_url="http://x/v1", http_client=choice)  # type: ignore[arg-type]
        clients = http_clients([provider], in_flight=40)
        status: int | None = None
        try:
            status = (await clients[0].get(unreachable)).status_code
        except httpx.ConnectError:
            status = None
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))
            server.close()
            await server.wait_closed()
        return seen, status

    seen, status = asyncio.run(scenario())
    if choice == "httpx":
        assert status == 200
        assert seen == [f"GET {unreachable} HTTP/1.1".encode()]
    else:
        assert status is None  # went straight to the closed port
        assert seen == []


@pytest.mark.parametrize("choice", ["fast", "httpx"])
def test_probe_goes_the_way_the_requests_go(monkeypatch: pytest.MonkeyPatch, choice: str) -> None:
    """With http_client="httpx" the pre-flight probe goes through HTTP_PROXY; with "fast" it goes direct."""
    unreachable = f"http://127.0.0.1:{free_port()}/v1"  # only the proxy can answer for it

    async def scenario() -> tuple[list[bytes], str | None]:
        seen: list[bytes] = []
        server = await _serve_as_proxy(seen)
        port = server.sockets[0].getsockname()[1]
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        try:
            await probe(unreachable, timeout_s=5.0, http_client=choice)
            problem = None
        except ConfigError as exc:
            problem = str(exc)
        finally:
            server.close()
            await server.wait_closed()
        return seen, problem

    seen, problem = asyncio.run(scenario())
    if choice == "httpx":
        assert problem is None
        assert seen == [f"GET {unreachable} HTTP/1.1".encode()]
    else:
        assert problem is not None
        assert "is unreachable" in problem
        assert seen == []


def test_probe_through_a_dead_proxy_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """With http_client="httpx" and a proxy nobody listens on, the probe fails in one line naming the URL."""
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ConfigError) as info:
        asyncio.run(probe(url, timeout_s=5.0, http_client="httpx"))
    message = str(info.value)
    assert message.startswith(f"provider.base_url: {url} is unreachable")
    assert "\n" not in message


def test_httpx_choice_splits_slots_over_small_clients() -> None:
    """With httpx's transport the slots are split over clients of 16 (its pool degrades when shared)."""
    provider = ProviderConfig(kind="chat", base_url="http://x/v1", http_client="httpx")

    async def count() -> int:
        clients = http_clients([provider], in_flight=40)
        await asyncio.gather(*(c.aclose() for c in clients))
        return len(clients)

    assert asyncio.run(count()) == 3


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("wire", ["anthropic", "responses", "chat", "gemini"])
def test_samples_of_one_task_differ_on_every_simulated_wire(
    tmp_path: Path, wire: str, streaming: bool
) -> None:
    """Samples of one task get different simulated replies on every wire and mode, seed field or not."""
    cfg = small_config(
        tmp_path / "run",
        provider={"kind": "sim", "sim_transport": wire, "streaming": streaming},
        sweep={"models": ["sim-verbose"], "budgets": [512]},
        env={"name": "arithmetic", "tasks": 1},
        samples_per_task=8,
    )
    episodes = run_plan(cfg)
    assert StopReason.ERROR not in {e.stop_reason for e in episodes}  # the header is accepted
    # sim-verbose draws the length of the text before each call: 8 identical replies would
    # mean the samples were one sample written eight times.
    first_turn_tokens = {e.turns[0].output_tokens for e in episodes}
    assert len(first_turn_tokens) > 1


def test_each_provider_of_a_sweep_sends_its_own_extra_fields(tmp_path: Path) -> None:
    """`provider.extra_body` reaches that provider's requests only, merged over `sampling.extra_body`."""
    from collector.sim.app import create_app
    from tests.loopback import serving

    seen: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}

    def recording(name: str) -> Any:
        inner = create_app(seed=1)

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await inner(scope, receive, send)
                return
            chunks = []
            while True:
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            body = b"".join(chunks)
            if body and scope["path"].endswith("/chat/completions"):
                seen[name].append(json.loads(body))
            replayed = False

            async def replay() -> Any:
                nonlocal replayed
                if replayed:
                    return await receive()
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}

            await inner(scope, replay, send)

        return app

    with serving(recording("a")) as url_a, serving(recording("b")) as url_b:
        cfg = small_config(
            tmp_path / "run",
            sampling={"extra_body": {"metadata": {"run": "r1"}, "top_k": 40}},
            sweep={"models": ["sim-terse"], "budgets": [256], "providers": [
                {"kind": "chat", "base_url": f"{url_a}/v1", "api_key_env": "PATH", "label": "a",
                 "extra_body": {"top_k": 5, "metadata": {"pool": "a"}}},
                {"kind": "chat", "base_url": f"{url_b}/v1", "api_key_env": "PATH", "label": "b"},
            ]},
            env={"name": "arithmetic", "tasks": 1},
        )
        episodes = run_plan(cfg)
    assert StopReason.ERROR not in {e.stop_reason for e in episodes}
    assert seen["a"]
    assert seen["b"]
    assert all(r["top_k"] == 5 and r["metadata"] == {"run": "r1", "pool": "a"} for r in seen["a"])
    assert all(r["top_k"] == 40 and r["metadata"] == {"run": "r1"} for r in seen["b"])
