"""StreamTransport against real loopback servers: framing, reuse, stale connections, errors."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint
from collector.providers.transport import StreamTransport, fast_client
from collector.sim import SimServer
from collector.turn import SamplingParams, TurnRequest, UserMessage

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return await reader.readexactly(length)


async def _serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


@pytest.fixture
async def echo() -> AsyncIterator[tuple[str, list[int]]]:
    """A keep-alive server that echoes the body back; records one entry per connection."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                body = await _read_request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server, url = await _serve(handle)
    async with server:
        yield url, connections


async def test_keep_alive_reuses_one_connection(echo: tuple[str, list[int]]) -> None:
    """Sequential requests on one client travel over a single kept-alive connection."""
    url, connections = echo
    async with httpx.AsyncClient(transport=StreamTransport()) as client:
        for i in range(5):
            response = await client.post(url + "/x", content=b"hello %d" % i)
            assert response.content == b"hello %d" % i
    assert len(connections) == 1


@pytest.mark.parametrize(
    ("version", "connection", "reused"),
    [("1.1", "close", False), ("1.1", "keep-alive", True), ("1.0", "keep-alive", True), ("1.0", None, False)],
)
async def test_the_connection_header_decides_whether_the_connection_is_kept(
    version: str, connection: str | None, reused: bool
) -> None:
    """`connection: close` ends a 1.1 connection after its reply, `keep-alive` keeps a 1.0 one;
    without the header 1.1 keeps and 1.0 closes. A connection the server keeps is reused."""
    handlers: list[asyncio.Task[None]] = []
    header = b"" if connection is None else b"connection: %s\r\n" % connection.encode()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.current_task())  # type: ignore[arg-type]  # a handler runs as a task
        try:
            while True:
                await _read_request(reader)
                writer.write(b"HTTP/%s 200 OK\r\ncontent-length: 2\r\n%s\r\nok" % (version.encode(), header))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            await writer.wait_closed()

    server, url = await _serve(handle)
    async with server:
        async with httpx.AsyncClient(transport=StreamTransport()) as client:
            replies = [await client.post(url, content=b"x") for _ in range(3)]
        await asyncio.gather(*handlers)  # each connection's end, seen by the server once the client closed it
    assert [r.content for r in replies] == [b"ok"] * 3
    assert len(handlers) == (1 if reused else 3)


async def test_concurrent_requests_open_connections_not_queues(echo: tuple[str, list[int]]) -> None:
    """Concurrent requests each get a connection at once, and every body comes back intact."""
    url, connections = echo
    async with httpx.AsyncClient(transport=StreamTransport()) as client:
        bodies = [b"x" * (1000 + i) for i in range(20)]
        replies = await asyncio.gather(*(client.post(url, content=b) for b in bodies))
    assert [r.content for r in replies] == bodies
    assert 1 <= len(connections) <= 20


async def test_chunked_and_close_delimited_bodies() -> None:
    """Chunked bodies and bodies ended by closing the connection are both read whole."""
    calls = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal calls
        calls += 1
        await _read_request(reader)
        if calls == 1:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                         b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n")
            await writer.drain()
            await _read_request(reader)  # the next request on the same connection
            calls += 1
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil close")
        await writer.drain()
        writer.close()

    server, url = await _serve(handle)
    async with server, httpx.AsyncClient(transport=StreamTransport()) as client:
        first = await client.post(url, content=b"a")
        second = await client.post(url, content=b"b")
    assert first.content == b"hello world"
    assert second.content == b"until close"


@pytest.mark.parametrize("ending", ["close", "reset"])
async def test_stale_keep_alive_connection_is_replaced(ending: str) -> None:
    """A kept-alive connection the server closed (or reset) after its reply is not reused to
    fail a request."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        if ending == "reset":  # SO_LINGER 0: the close sends RST, and the next read fails with ECONNRESET
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                       struct.pack("ii", 1, 0))
        writer.close()  # closes without saying `connection: close`

    server, url = await _serve(handle)
    async with server, httpx.AsyncClient(transport=StreamTransport()) as client:
        replies = [await client.post(url, content=b"x") for _ in range(4)]
    assert [r.content for r in replies] == [b"ok"] * 4


async def test_errors_are_httpx_types() -> None:
    """A refused connection, a silent server and garbage replies raise httpx's own exceptions."""
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # never answers; returns when the client gives up and closes
        writer.close()

    server, url = await _serve(silent)
    port = int(url.rsplit(":", 1)[1])
    async with server, httpx.AsyncClient(transport=StreamTransport()) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(url, content=b"x", timeout=0.2)
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(transport=StreamTransport()) as client:
            await client.post(f"http://127.0.0.1:{port}", content=b"x")

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"SPDY/9 what\r\n\r\n")
        await writer.drain()
        writer.close()

    server, url = await _serve(garbage)
    async with server, httpx.AsyncClient(transport=StreamTransport()) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(url, content=b"x")


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("streaming", [False, True])
async def test_adapters_over_the_simulator(streaming: bool, direct: bool) -> None:
    """The chat adapter completes a turn over StreamTransport, streamed (SSE) and not, through
    httpx's client and on the collector's direct path (`fast_client`)."""
    with SimServer() as sim:
        endpoint = Endpoint(base_url_for("chat", sim.base_url), streaming=streaming)
        async with fast_client() if direct else httpx.AsyncClient(transport=StreamTransport()) as client:
            provider = build_provider("chat", endpoint, client)
            request = TurnRequest("sim-perfect", [UserMessage("What is the status of order A-1?")], [], 64,
                                  SamplingParams(seed=1))
            turns = [await provider.complete(request) for _ in range(3)]
    assert all(t.usage.output_tokens > 0 for t in turns)
    assert len({t.text for t in turns}) == 1


async def test_fast_client_keeps_cookies_a_server_sets() -> None:
    """The collector's client still stores a Set-Cookie and sends it back; replies without one store none."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for reply in (b"set-cookie: lb=node-7; Path=/\r\n", b""):
            head = await reader.readuntil(b"\r\n\r\n")
            seen.append(head)
            await _read_request_body(reader, head)
            writer.write(b"HTTP/1.1 200 OK\r\n" + reply + b"content-length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    server, url = await _serve(handle)
    async with server, fast_client() as client:
        await client.post(url, content=b"a")
        await client.post(url, content=b"b")
        assert dict(client.cookies) == {"lb": "node-7"}
    assert b"lb=node-7" in seen[1].lower()


async def _read_request_body(reader: asyncio.StreamReader, head: bytes) -> bytes:
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return await reader.readexactly(length)


async def test_resend_on_a_reused_connection_happens_once_and_may_repeat_a_request() -> None:
    """A request that got no byte back on a reused connection is sent once more on a new one, even when
    the server had read it (so the server sees it twice); on a fresh connection it is never resent."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                body = await _read_request(reader)
                seen.append(body)
                if body == b"drop" and seen.count(b"drop") == 1:
                    break  # read it whole, then die without a byte of reply
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed its kept-alive connection
        writer.close()

    server, url = await _serve(handle)
    async with server, httpx.AsyncClient(transport=StreamTransport()) as client:
        assert (await client.post(url, content=b"first")).content == b"ok"
        assert (await client.post(url, content=b"drop")).content == b"ok"  # reused, dropped, resent
    assert seen == [b"first", b"drop", b"drop"]

    seen.clear()
    server, url = await _serve(handle)
    async with server, httpx.AsyncClient(transport=StreamTransport()) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(url, content=b"drop")  # fresh connection: no resend here
    assert seen == [b"drop"]
