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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

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


class Provider(Protocol):
    """One wire format. Implementations: chat, responses, anthropic, gemini."""

    kind: str

    async def complete(self, request: TurnRequest) -> Turn: ...
