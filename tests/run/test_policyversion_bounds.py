"""A declared policy version's source under faults: a FIFO, a device, a dripping or huge URL
reply, or a source that raises makes the turn's version unknown, never a stall or a failed
episode (collector.run.policyversion)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from collector.providers.scripted import ScriptedProvider, text
from collector.run.policyversion import MAX_REPLY_BYTES, DeclaredVersion, VersionedProvider
from collector.turn import TurnRequest, UserMessage


async def _read(reader: DeclaredVersion, transport: httpx.AsyncBaseTransport | None = None) -> str | None:
    transport = transport or httpx.MockTransport(lambda r: httpx.Response(500))
    async with httpx.AsyncClient(transport=transport) as client:
        return await reader.read(client)


def _read_in_a_thread(reader: DeclaredVersion, fifo: Path) -> str | None:
    """Read in a thread, so a read that blocks on the FIFO fails the test instead of hanging it."""
    result: dict[str, str | None] = {}
    thread = threading.Thread(target=lambda: result.update(v=asyncio.run(_read(reader))), daemon=True)
    thread.start()
    thread.join(30)
    if thread.is_alive():  # blocked in open(): give it a writer so the thread can end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(30)
        pytest.fail("reading policy_version_file blocked on a FIFO")
    return result["v"]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_fifo_is_refused_at_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A policy_version_file that is a FIFO is not opened for a blocking read: the version is
    unknown at once, with a warning that names it."""
    fifo = tmp_path / "version"
    os.mkfifo(fifo)
    with caplog.at_level(logging.WARNING):
        assert _read_in_a_thread(DeclaredVersion(path=str(fifo)), fifo) is None
    assert any("a FIFO, not read" in w for w in _warnings(caplog))


def test_a_fifo_swapped_in_after_the_stat_never_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A file replaced by a FIFO between the stat and the open is refused on the open descriptor."""
    regular = tmp_path / "regular"
    regular.write_text("step-1\n")
    fifo = tmp_path / "version"
    os.mkfifo(fifo)
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda path, *a, **k: real_stat(regular if path == str(fifo) else path))
    with caplog.at_level(logging.WARNING):
        assert _read_in_a_thread(DeclaredVersion(path=str(fifo)), fifo) is None
    assert any("a FIFO, not read" in w for w in _warnings(caplog))


async def test_a_device_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    """A device (/dev/zero, which never ends) is not read as a version file."""
    with caplog.at_level(logging.WARNING):
        assert await _read(DeclaredVersion(path="/dev/zero")) is None
    assert any("a device, not read" in w for w in _warnings(caplog))


class _Body(httpx.AsyncByteStream):
    """A reply body: `chunks` of `chunk` bytes, `pause_s` apart, counting what was sent."""

    def __init__(self, chunk: bytes, chunks: int, pause_s: float = 0.0) -> None:
        self.chunk, self.chunks, self.pause_s = chunk, chunks, pause_s
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.chunks):
            if self.pause_s:
                await asyncio.sleep(self.pause_s)
            self.sent += len(self.chunk)
            yield self.chunk


async def test_a_dripping_reply_is_bounded_in_total_time(caplog: pytest.LogCaptureFixture) -> None:
    """A version URL whose body drips a byte at a time (each read well inside the timeout) is cut
    at policy_version_timeout_s in total: unknown, not a stalled turn."""
    body = _Body(b"7", chunks=10**9, pause_s=0.05)
    transport = httpx.MockTransport(lambda r: httpx.Response(200, stream=body))
    reader = DeclaredVersion(url="http://trainer/model_info", timeout_s=0.5)
    with caplog.at_level(logging.WARNING):
        assert await asyncio.wait_for(_read(reader, transport), 30) is None
    assert body.sent > 0  # the reply was under way when the bound cut it
    assert any("no whole reply within 0.5s" in w for w in _warnings(caplog))


async def test_a_huge_reply_is_bounded_in_bytes(caplog: pytest.LogCaptureFixture) -> None:
    """A 64 MiB version reply is dropped after MAX_REPLY_BYTES, never read (or held) whole."""
    body = _Body(b"x" * (1 << 20), chunks=64)
    transport = httpx.MockTransport(lambda r: httpx.Response(200, stream=body))
    reader = DeclaredVersion(url="http://trainer/model_info", timeout_s=30)
    with caplog.at_level(logging.WARNING):
        assert await _read(reader, transport) is None
    assert body.sent <= MAX_REPLY_BYTES + (1 << 20)
    assert any("reply over" in w for w in _warnings(caplog))


async def test_a_source_that_raises_leaves_the_version_unknown_not_the_episode_failed() -> None:
    """Whatever the version source raises, the turn comes back with an unknown version."""
    def broken(request: httpx.Request) -> httpx.Response:
        raise RuntimeError("the trainer's endpoint is broken in a way nobody foresaw")

    reader = DeclaredVersion(url="http://trainer/model_info")
    async with httpx.AsyncClient(transport=httpx.MockTransport(broken)) as client:
        provider = VersionedProvider(ScriptedProvider([text("fine")]), reader, client)
        turn = await provider.complete(TurnRequest("m", [UserMessage("hi")], [], 64))
    assert turn.text == "fine"
    assert (turn.policy_version, turn.policy_version_source) == (None, None)
