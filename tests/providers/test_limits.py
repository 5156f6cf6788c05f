"""Per-request limits over real loopback servers, on both HTTP clients, streamed and not.

`provider.request_timeout_s` is an idle limit (a reply that keeps arriving is never cut by
it), `provider.request_deadline_s` a total limit per attempt, `provider.max_reply_bytes` the
largest body read. The servers drip their replies in small pieces with short pauses, so a
limit on the whole reply and a limit between bytes give different answers.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from collector.errors import ProtocolViolation, ProviderUnavailable
from collector.providers import build_provider
from collector.providers.base import Endpoint, Provider, RetryPolicy
from collector.providers.transport import fast_client
from tests.providers.conftest import Sleeps, request
from tests.providers.wirefab import Fab, FabCall, build

CLIENTS: dict[str, Callable[[], httpx.AsyncClient]] = {
    "fast": fast_client,
    "httpx": lambda: httpx.AsyncClient(timeout=None),
}
#: Pause between two pieces of a dripped reply: far below the idle limits used here.
PAUSE_S = 0.02
PIECES = 50


def reply(stream: bool) -> bytes:
    call = FabCall("call_1", "refund", '{"order_id":"A-1","amount":5}', {"order_id": "A-1", "amount": 5})
    return build("chat", Fab([call]), stream)


class Dripper:
    """A loopback HTTP/1.1 server answering every request with `body` in `PIECES` pieces.

    Streamed replies are chunked (as real SSE is), whole ones framed by Content-Length;
    `declared` overrides the Content-Length sent. Counts the requests it was sent.
    """

    def __init__(self, body: bytes, stream: bool, declared: int | None = None, pause_s: float = PAUSE_S):
        self.body = body
        self.stream = stream
        self.declared = declared
        self.pause_s = pause_s
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                self.requests += 1
                await self._answer(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter) -> None:
        ctype = b"text/event-stream" if self.stream else b"application/json"
        head = b"HTTP/1.1 200 OK\r\ncontent-type: " + ctype + b"\r\n"
        size = -(-len(self.body) // PIECES)
        pieces = [self.body[i : i + size] for i in range(0, len(self.body), size)]
        if self.stream:
            writer.write(head + b"transfer-encoding: chunked\r\n\r\n")
            for piece in pieces:
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                await asyncio.sleep(self.pause_s)
            writer.write(b"0\r\n\r\n")
        else:
            declared = self.declared if self.declared is not None else len(self.body)
            writer.write(head + b"content-length: %d\r\n\r\n" % declared)
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(self.pause_s)
            if declared != len(self.body):
                raise ConnectionResetError  # the rest of a declared body never comes
        await writer.drain()


@asynccontextmanager
async def provider_over(
    server: Dripper, client_kind: str, retries: int = 1, **limits: float | int | None
) -> AsyncIterator[Provider]:
    """A chat adapter over `server` on the given HTTP client, with the given Endpoint limits."""
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    retry = RetryPolicy(max_retries=retries)
    endpoint = Endpoint(f"http://127.0.0.1:{port}/v1", streaming=server.stream, retry=retry, **limits)
    client = CLIENTS[client_kind]()
    try:
        async with listener:
            yield build_provider("chat", endpoint, client, sleep=Sleeps(), rng=random.Random(0))
    finally:
        await client.aclose()


@pytest.mark.parametrize("client_kind", sorted(CLIENTS))
@pytest.mark.parametrize("stream", [False, True])
async def test_a_slowly_dripping_reply_outlasts_the_idle_timeout(client_kind: str, stream: bool) -> None:
    """A correct reply that keeps arriving completes, though it takes longer than request_timeout_s."""
    server = Dripper(reply(stream), stream)
    # The reply takes PIECES x PAUSE_S = 1 s in all; no pause is anywhere near 0.4 s.
    async with provider_over(server, client_kind, request_timeout_s=0.4) as provider:
        turn = await provider.complete(request())
    assert [c.name for c in turn.tool_calls] == ["refund"]
    assert server.requests == 1  # never timed out and asked again


@pytest.mark.parametrize("client_kind", sorted(CLIENTS))
@pytest.mark.parametrize("stream", [False, True])
async def test_a_reply_over_the_total_deadline_is_retried_then_fails(client_kind: str, stream: bool) -> None:
    """A reply still arriving at request_deadline_s is a retried timeout, then ProviderUnavailable."""
    server = Dripper(reply(stream), stream)
    async with provider_over(
        server, client_kind, retries=1, request_timeout_s=30.0, request_deadline_s=0.3
    ) as provider:
        with pytest.raises(ProviderUnavailable, match=r"request_deadline_s = 0\.3s"):
            await provider.complete(request())
    assert server.requests == 2  # the first attempt and its one retry


@pytest.mark.parametrize("client_kind", sorted(CLIENTS))
@pytest.mark.parametrize("stream", [False, True])
async def test_a_reply_over_max_reply_bytes_is_a_protocol_violation(client_kind: str, stream: bool) -> None:
    """A reply body longer than max_reply_bytes is abandoned as a ProtocolViolation, retried, never a turn."""
    fab = Fab(text="x" * 300_000, out_tokens=5)  # 300 KB of text claiming 5 output tokens
    server = Dripper(build("chat", fab, stream), stream, pause_s=0)
    async with provider_over(server, client_kind, retries=1, max_reply_bytes=100_000) as provider:
        with pytest.raises(ProtocolViolation, match="max_reply_bytes = 100000"):
            await provider.complete(request())
    assert server.requests == 2


@pytest.mark.parametrize("client_kind", sorted(CLIENTS))
async def test_a_declared_length_over_max_reply_bytes_is_refused_unread(client_kind: str) -> None:
    """A Content-Length of 1.5 GB is refused from the head: the body is not waited for."""
    server = Dripper(reply(False), False, declared=1_500_000_000, pause_s=0)
    async with provider_over(server, client_kind, retries=0) as provider:
        with pytest.raises(ProtocolViolation, match="max_reply_bytes"):
            await provider.complete(request())
