"""The provider interface: one async call from a `TurnRequest` to a normalized `Turn`.

An adapter speaks one wire format over an `httpx.AsyncClient` it is handed; it never builds
its own client, so the job decides the connection layout (many small clients, see
runtime-notes) and tests hand it an `httpx.ASGITransport` over the simulator. Credentials
and the base URL live in `Endpoint`, apart from the dialect.

Contract of `complete`:
- returns a `Turn` for every reply the transport considers a reply, including cut turns
  (truncation is data, not an exception) and turns whose tool calls are malformed;
- retries what `collector.errors` marks retryable, with capped exponential back-off and
  jitter, honouring `retry-after-ms` / `retry-after`; a partial stream that errors is
  discarded and retried whole, never returned;
- raises only `collector.errors.ProviderError` subclasses (after retries), never httpx or
  JSON exceptions, and never puts a key, header or raw fragment in a message.

Adapters are built with `collector.providers.build_provider(kind, endpoint, client)`; each
takes keyword-only `sleep` (the back-off sleep, `asyncio.sleep` by default) and `rng` (the
jitter source) so tests never wait. Where a turn becomes a length turn, and in which order
the checks run, is `collector.providers.common.finish_turn` (listed in `collector.turn`).

Tests: tests/providers/test_package.py, tests/providers/test_transport.py,
tests/providers/test_errors_retries.py.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from collector.turn import Turn, TurnRequest


@dataclass(slots=True, frozen=True)
class RetryPolicy:
    max_retries: int = 4
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_retry_after_s: float = 120.0
    """A server asking to wait longer than this is treated as unavailable now."""


@dataclass(slots=True, frozen=True)
class Endpoint:
    """Where and as whom to call. `api_key` is held here only, never logged or recorded."""

    base_url: str
    api_key: str | None = field(default=None, repr=False)
    streaming: bool = False
    request_timeout_s: float = 60.0
    """Idle limit: connect, and each wait for the next bytes of the reply (or to send)."""
    request_deadline_s: float | None = None
    """Total limit per attempt, request to last byte; None: only the idle limit applies."""
    max_reply_bytes: int = 32 * 1024 * 1024
    """A reply body (decoded) longer than this is a `ProtocolViolation`, never read whole."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    cap_field: str | None = None
    """Chat Completions only: which request field carries the output cap
    (`max_completion_tokens` by default; many OpenAI-compatible servers want `max_tokens`)."""
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    """(user, password) written in the configured base URL (`https://user:pass@host/v1`),
    sent as `Authorization: Basic`; `base_url` itself then holds no user info
    (`split_url_credentials`)."""
    query: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """The configured base URL's query parameters (a `?key=...` among them), sent with every
    request; `base_url` itself then holds no query, so paths are appended to it intact."""
    credentials: tuple[str, ...] = field(default=(), repr=False)
    """Every credential value this endpoint sends, in every form it is sent (the key, a URL
    password, its `Basic` base64 form, a query key): scrubbed from every message built from
    a reply (`collector.episode.redact.credential_values` computes it)."""


def split_url_credentials(url: str) -> tuple[str, tuple[str, str] | None, tuple[tuple[str, str], ...]]:
    """(the URL without user info, query or fragment; (user, password) decoded or None; the
    query's (name, value) pairs, decoded). What `Endpoint` sends is built from these."""
    parts = urlsplit(url)
    basic = None
    if parts.username is not None or parts.password is not None:
        basic = (unquote(parts.username or ""), unquote(parts.password or ""))
    netloc = parts.netloc.rpartition("@")[2]
    query = tuple(parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")), basic, query


def basic_authorization(user: str, password: str) -> str:
    """The `Authorization` header value for HTTP Basic credentials."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class Provider(Protocol):
    """One wire format. Implementations: chat, responses, anthropic, gemini."""

    kind: str

    async def complete(self, request: TurnRequest) -> Turn: ...
