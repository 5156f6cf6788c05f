"""A declared policy version: what the run says sampled each turn when the server does not.

Most servers report no weight version per request (vLLM's OpenAI server has none; SGLang
puts `metadata.weight_version` on non-streamed Chat replies only; hosted APIs have none).
An RL trainer that swaps weights between steps knows the version, so it can declare it, in
one of three ways (`provider.policy_version*`, at most one of them):

- `policy_version`: a constant (a run against one checkpoint);
- `policy_version_file`: a file the trainer rewrites between steps, read before each
  request (and after its reply, see below). Cheap on purpose: one `stat` per reading, the
  file read again only when its mtime or size changed; its text, stripped, is the version
  (empty or missing: unknown). Only a regular file is read: a FIFO would block the worker's
  event loop in `open` until a writer came (forever), and a device never ends, so anything
  else is refused (unknown, with the warning); it is opened non-blocking and checked again
  on the open descriptor, so a swap after the `stat` cannot block either;
- `policy_version_url`: a GET before each request, bounded in total by
  `provider.policy_version_timeout_s` (connect, headers and the whole body: a server that
  drips a byte a second never resets the clock) and in size by `MAX_REPLY_BYTES` (a version
  is a short label; a 300 MB body is stopped at the bound, never held); the reply is a JSON
  object with `weight_version`
  (SGLang's `/model_info`, formerly `/get_weight_version`) or `policy_version`, a JSON
  string or number, or plain text. A failed or slow read is an unknown version, never a failed episode: a
  turn's data is not worth less because the trainer's endpoint blinked, and "unknown" is
  recorded as such (None), never as a guess.

A version the server reports wins over a declared one (it is the server's own account of
the weights that answered); `Turn.policy_version_source` records which.

When the version is read: before the request *and* after the reply (a file or URL; a
constant cannot change). The reading before alone is not enough: a swap between it and the
request reaching the server gives a turn answered by the new weights and labelled with the
old (the done-when test met exactly that). So: the two readings agree -> that version; they
differ -> unknown (None: the swap came during the call, and which side of it answered
cannot be told from outside the server); the call was re-sent because the server aborted it
(`abort`: weights swapped under it) -> the reading after (the request that answered started
after the swap that aborted its predecessor, and a second swap would have aborted it too).

A read failure is logged once per reader (not per turn) at warning level, its message
without the URL's query (URLs may carry keys). Whatever a reading raises, it is an unknown
version for that turn (`VersionedProvider`), never the episode's failure.

Tests: tests/run/test_policyversion.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from dataclasses import dataclass

import httpx

from collector.config import ProviderConfig
from collector.providers.base import Provider
from collector.providers.http import ABORT_CAUSE
from collector.turn import Turn, TurnRequest

__all__ = [
    "MAX_REPLY_BYTES", "DeclaredVersion", "VersionedProvider", "declared_version", "version_from_reply",
]

_log = logging.getLogger(__name__)
_MAX_VERSION_CHARS = 200
"""A version is a short label; anything longer is not one (a page of HTML from a proxy)."""
MAX_REPLY_BYTES = 64 * 1024
"""The most of a `policy_version_url` reply read (SGLang's `/model_info` is a few hundred
bytes); a longer one is not a version, and is dropped without being read further."""
_FILE_BYTES = 4096
"""The most of a `policy_version_file` read."""


def _open_nonblocking(path: str, flags: int) -> int:
    # O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer.
    return os.open(path, flags | os.O_NONBLOCK)


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def version_from_reply(content: bytes) -> str | None:
    """The version a file or an endpoint holds (see the module docstring), or None."""
    text = content.decode("utf-8", "replace").strip()
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        value = text
    if isinstance(value, dict):
        value = value.get("weight_version", value.get("policy_version"))
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    version = str(value).strip()
    return version if version and len(version) <= _MAX_VERSION_CHARS else None


@dataclass(slots=True)
class DeclaredVersion:
    """Reads the declared version before a request: a constant, a file or a URL."""

    constant: str | None = None
    path: str | None = None
    url: str | None = None
    timeout_s: float = 2.0
    _stamp: tuple[int, int] | None = None
    _cached: str | None = None
    _warned: bool = False

    async def read(self, client: httpx.AsyncClient) -> str | None:
        if self.constant is not None:
            return self.constant
        if self.path is not None:
            return self._read_file(self.path)
        if self.url is not None:
            return await self._read_url(client, self.url)
        return None

    def _read_file(self, path: str) -> str | None:
        try:
            st = os.stat(path)
        except OSError as exc:
            self._warn(f"provider.policy_version_file {path}: {exc.strerror or type(exc).__name__}")
            self._stamp, self._cached = None, None
            return None
        if not stat.S_ISREG(st.st_mode):
            self._refuse_file(path, st.st_mode)
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                with open(path, "rb", opener=_open_nonblocking) as f:
                    mode = os.fstat(f.fileno()).st_mode
                    if not stat.S_ISREG(mode):  # replaced by a FIFO or a device since the stat
                        self._refuse_file(path, mode)
                        return None
                    self._cached = version_from_reply(f.read(_FILE_BYTES))
            except OSError as exc:
                self._warn(f"provider.policy_version_file {path}: {exc.strerror or type(exc).__name__}")
                return None
            self._stamp = stamp
        return self._cached

    def _refuse_file(self, path: str, mode: int) -> None:
        self._warn(f"provider.policy_version_file {path}: {_file_kind(mode)}, not read (a regular file only)")
        self._stamp, self._cached = None, None

    async def _read_url(self, client: httpx.AsyncClient, url: str) -> str | None:
        try:
            # One deadline for the whole exchange; httpx's own timeout is per read, which a
            # server dripping a byte at a time never trips.
            async with asyncio.timeout(self.timeout_s):
                return await self._fetch(client, url)
        except TimeoutError:
            self._warn(f"provider.policy_version_url: no whole reply within {self.timeout_s:g}s")
        except httpx.HTTPError as exc:
            self._warn(f"provider.policy_version_url: {type(exc).__name__}")
        return None

    async def _fetch(self, client: httpx.AsyncClient, url: str) -> str | None:
        async with client.stream("GET", url, timeout=self.timeout_s) as response:
            if response.status_code != 200:
                self._warn(f"provider.policy_version_url: HTTP {response.status_code}")
                return None
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_REPLY_BYTES:
                    self._warn(f"provider.policy_version_url: reply over {MAX_REPLY_BYTES} bytes, "
                               "not a version")
                    return None
        return version_from_reply(bytes(body))

    async def read_or_unknown(self, client: httpx.AsyncClient) -> str | None:
        """`read`, with any failure of the source an unknown version (None), said once."""
        try:
            return await self.read(client)
        except Exception as exc:  # noqa: BLE001 - a version source never fails an episode: unknown is recorded
            self._warn(f"provider.policy_version*: {type(exc).__name__}")
            return None

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            _log.warning("%s: the turns' declared policy version is unknown while it fails", message)


def declared_version(provider: ProviderConfig) -> DeclaredVersion | None:
    """The reader a provider's config declares, or None when it declares no version."""
    if provider.policy_version is None and provider.policy_version_file is None and (
        provider.policy_version_url is None
    ):
        return None
    return DeclaredVersion(
        constant=provider.policy_version,
        path=provider.policy_version_file,
        url=provider.policy_version_url,
        timeout_s=provider.policy_version_timeout_s,
    )


class VersionedProvider:
    """A provider whose turns carry the declared version where the server reported none."""

    __slots__ = ("_client", "_declared", "_inner", "kind")

    def __init__(self, inner: Provider, declared: DeclaredVersion, client: httpx.AsyncClient) -> None:
        self._inner = inner
        self._declared = declared
        self._client = client
        self.kind = inner.kind

    async def complete(self, request: TurnRequest) -> Turn:
        before = await self._declared.read_or_unknown(self._client)
        turn = await self._inner.complete(request)
        if turn.policy_version is None and self._declared.constant is None:
            after = await self._declared.read_or_unknown(self._client)
            # Re-sent after an abort: the request that answered started after the swap that
            # aborted it (a second swap would have aborted it again), so the later reading is
            # the one. Otherwise a version that changed during the call leaves it unknown.
            version = after if ABORT_CAUSE in turn.retries or before == after else None
            if version is not None:
                turn.policy_version, turn.policy_version_source = version, "declared"
        elif turn.policy_version is None and before is not None:
            turn.policy_version, turn.policy_version_source = before, "declared"
        return turn
