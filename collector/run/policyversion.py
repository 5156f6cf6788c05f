"""A declared policy version: what the run says sampled each turn when the server does not.

Most servers report no weight version per request (vLLM's OpenAI server has none; SGLang
puts `metadata.weight_version` on non-streamed Chat replies only; hosted APIs have none).
An RL trainer that swaps weights between steps knows the version, so it can declare it, in
one of three ways (`provider.policy_version*`, at most one of them):

- `policy_version`: a constant (a run against one checkpoint);
- `policy_version_file`: a file the trainer rewrites between steps, read before each
  request (and after its reply, see below). Cheap on purpose: one `stat` per reading, the
  file read again only when its mtime or size changed; its text, stripped, is the version
  (empty or missing: unknown);
- `policy_version_url`: a GET before each request, bounded by
  `provider.policy_version_timeout_s`; the reply is a JSON object with `weight_version`
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
without the URL's query (URLs may carry keys).

Tests: tests/run/test_policyversion.py.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import httpx

from collector.config import ProviderConfig
from collector.providers.base import Provider
from collector.providers.http import ABORT_CAUSE
from collector.turn import Turn, TurnRequest

__all__ = ["DeclaredVersion", "VersionedProvider", "declared_version", "version_from_reply"]

_log = logging.getLogger(__name__)
_MAX_VERSION_CHARS = 200
"""A version is a short label; anything longer is not one (a page of HTML from a proxy)."""


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
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                with open(path, "rb") as f:
                    self._cached = version_from_reply(f.read(4096))
            except OSError as exc:
                self._warn(f"provider.policy_version_file {path}: {exc.strerror or type(exc).__name__}")
                return None
            self._stamp = stamp
        return self._cached

    async def _read_url(self, client: httpx.AsyncClient, url: str) -> str | None:
        try:
            response = await client.get(url, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            self._warn(f"provider.policy_version_url: {type(exc).__name__}")
            return None
        if response.status_code != 200:
            self._warn(f"provider.policy_version_url: HTTP {response.status_code}")
            return None
        return version_from_reply(response.content)

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
        before = await self._declared.read(self._client)
        turn = await self._inner.complete(request)
        if turn.policy_version is None and self._declared.constant is None:
            after = await self._declared.read(self._client)
            # Re-sent after an abort: the request that answered started after the swap that
            # aborted it (a second swap would have aborted it again), so the later reading is
            # the one. Otherwise a version that changed during the call leaves it unknown.
            version = after if ABORT_CAUSE in turn.retries or before == after else None
            if version is not None:
                turn.policy_version, turn.policy_version_source = version, "declared"
        elif turn.policy_version is None and before is not None:
            turn.policy_version, turn.policy_version_source = before, "declared"
        return turn
