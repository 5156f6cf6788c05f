"""Adaptive admission: how many model requests a worker has in flight per (provider, model).

The unit is the request, not the episode. The server feels requests: an episode between
two model calls (running a tool, grading) costs it nothing, so gating episodes would leave
the server idle while admitted episodes run tools, and would let one episode's retries
hold a slot the server never sees. The worker keeps its `ray.episodes_in_flight` episode
slots (the static setting, now the ceiling), and each (provider, model) pair gets one
`Admission`, which every attempt of every request to that pair passes through, retries
included (`AdmissionTransport` wraps the HTTP transport, so it sees each attempt's status,
headers, latency and transport failure without the adapters knowing).

The controller (`AimdController`) is TCP's congestion control applied to requests:

- slow start: the limit grows by one per healthy completion (doubling per round trip)
  from `INITIAL_LIMIT` until the first overload signal, or until the smoothed latency
  passes `SLOW_START_EXIT` x its floor (the queue has started to fill);
- additive increase: afterwards, by 1/limit per healthy completion (one per round trip),
  and only while the limit is used (a limit nobody presses against is not evidence);
- multiplicative decrease by `DECREASE`: on a 429, 503, 529, 504 or 408, on a timeout, and
  when the smoothed latency rises past `LATENCY_FACTOR` x its observed floor (the server
  queues: more in flight adds waiting, not throughput). One decrease per congestion event:
  a signal from a request sent before the last decrease does not cut again (the same rule
  as TCP's once per window), else a burst of 429s from one overload would collapse the
  limit to 1;
- `Retry-After` (and `retry-after-ms`) pauses all admission to the pair until it passes
  (a pause over `MAX_PAUSE_S` is not applied; a value that cannot be read, such as a date
  past what `datetime` holds, is no pause, and the request's slot is released regardless),
  not only the retry of the request that got it (`collector.providers.http` sleeps that
  one; the others would otherwise hit the same wall). The rate-limit headers of every
  reply (OpenAI `x-ratelimit-remaining-{requests,tokens}` with `-reset-*`, Anthropic
  `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-remaining` with
  `-reset`) pause admission before the server refuses: when what remains is less than the
  next request needs, until enough refills (from the `-limit` header's rate) or the reset.

The latency floor is the smallest smoothed latency seen, allowed to drift up by
`FLOOR_DRIFT` per completion so that a workload whose prompts grow (long histories late in
a sweep) is not read as a server in trouble forever.

Declared budgets (`provider.requests_per_minute`, `provider.tokens_per_minute`) are token
buckets (`TokenBucket`) in each worker, each holding budget / `ray.workers`. Splitting the
budget evenly is the simplest honest scheme: it never exceeds the budget whatever the
workers do, costs nothing per request, and its only loss is a worker with no work leaving
its share idle. A shared Ray actor would cost a round trip per request. A request's token
cost is estimated the way OpenAI's limiter counts it: the prompt (body bytes / 4) plus the
output cap it asks for; the server's own headers correct what the estimate misses.

A GPU server's own load (vLLM's and SGLang's Prometheus `/metrics`: requests queued, KV
cache in use, preemptions) is a third signal where the provider declares it
(`provider.server_metrics`): scraped at most once a second per gate, on the back of finished
requests, it cuts the limit when the engine preempts or its queue does not drain, and holds
it (no increase) while anything waits or the KV cache is full (`collector.run.servermetrics`).
Hosted APIs have no such endpoint; there the latency and status signals see the same
queueing from the client side.

Bound on throttling: a throttled request is retried by the adapter's retry loop
(`provider.retry.max_retries`, waiting the server's `Retry-After`); with admission paused
and the limit cut, the retry finds room, so an adaptive run spends at most a few retries
per throttle event and none ends as `error` while the budget allows
(tests/run/test_admission_run.py; bench/admission.py counts both).

Tests: tests/run/test_admission.py, tests/run/test_admission_run.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

from collector.providers.retryafter import header_retry_after_s, seconds_until
from collector.run.servermetrics import SCRAPE_INTERVAL_S, LoadVerdict, MetricsReader

__all__ = [
    "Admission",
    "AdmissionTransport",
    "AimdController",
    "TokenBucket",
    "admission_gauges",
    "header_pause_s",
    "request_tokens",
]

Clock = Callable[[], float]

INITIAL_LIMIT = 2.0
"""Requests in flight at the start (slow start doubles it per round trip)."""
DECREASE = 0.7
"""Multiplicative decrease: the limit kept after an overload signal."""
LATENCY_FACTOR = 2.0
"""Smoothed latency past this multiple of its floor counts as overload (queueing)."""
SLOW_START_EXIT = 1.5
"""Smoothed latency past this multiple of its floor ends slow start (no decrease)."""
LATENCY_ALPHA = 0.1
"""Weight of a new sample in the smoothed latency (an EWMA over about 10 replies)."""
FLOOR_DRIFT = 1.0005
"""Per completion, the latency floor may rise by this factor (see the module docstring)."""
MAX_PAUSE_S = 120.0
"""A server pause longer than this is not applied here, not even in part (the retry loop
gives up on the request that got it: `RetryPolicy.max_retry_after_s`, 120 s by default)."""
OVERLOAD_STATUSES = frozenset({408, 429, 503, 504, 529})
"""Statuses that say the server has too much: the decrease signals."""


class TokenBucket:
    """A budget of `rate` units per second, holding at most `capacity` (the burst).

    `delay(n)` says how long until `n` units are there; `take(n)` spends them (the level may
    go negative: a request larger than the burst still goes, and the next ones wait it off).
    The clock is injected so tests step it.
    """

    def __init__(self, rate: float, capacity: float, clock: Clock = time.monotonic) -> None:
        if rate <= 0 or capacity <= 0:
            raise ValueError("a token bucket needs a positive rate and capacity")
        self.rate = rate
        self.capacity = capacity
        self._clock = clock
        self._level = capacity
        self._at = clock()

    def _refill(self) -> float:
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._at) * self.rate)
        self._at = now
        return self._level

    def delay(self, n: float) -> float:
        """Seconds until `n` units are available (0: now); never more than the burst needs."""
        level = self._refill()
        need = min(n, self.capacity)
        return 0.0 if level >= need else (need - level) / self.rate

    def take(self, n: float) -> None:
        self._refill()
        self._level -= n


@dataclass(slots=True, frozen=True)
class Ticket:
    """One admitted request: when it started and under which decrease epoch."""

    started: float
    epoch: int


class AimdController:
    """The limit on requests in flight; pure bookkeeping, fed events, no I/O (see the module
    docstring for the rules). `ceiling` is the static setting."""

    def __init__(self, ceiling: int, clock: Clock = time.monotonic, initial: float = INITIAL_LIMIT) -> None:
        self.ceiling = max(1, ceiling)
        self.limit = min(float(self.ceiling), max(1.0, initial))
        self.threshold = float(self.ceiling)
        """Slow start runs while the limit is under this (set by the first decrease)."""
        self.in_flight = 0
        self.epoch = 0
        self.paused_until = 0.0
        self.smoothed: float | None = None
        self.floor: float | None = None
        self.throttled = 0
        """Overload signals seen (429s, 503s, timeouts, latency, the engine's metrics), for the
        progress line."""
        self.held = False
        """The engine's metrics say it is full: no increase until a scrape says otherwise."""
        self._epoch_at_scrape = 0
        self._clock = clock

    def has_room(self) -> bool:
        return self.in_flight < int(self.limit)

    def start(self) -> Ticket:
        self.in_flight += 1
        return Ticket(self._clock(), self.epoch)

    def pause(self, seconds: float) -> None:
        """Admit nothing for `seconds` (a Retry-After, an exhausted rate-limit window).

        A pause over `MAX_PAUSE_S` (NaN included) is not applied at all, not shortened to it:
        the request that got it fails at once (the retry loop's `max_retry_after_s`), and
        holding every other request to the pair for two minutes would only turn them into
        timeouts."""
        if 0 < seconds <= MAX_PAUSE_S:
            self.paused_until = max(self.paused_until, self._clock() + seconds)

    def pause_left(self) -> float:
        return max(0.0, self.paused_until - self._clock())

    def done(self, ticket: Ticket, overloaded: bool, waiting: bool = False, measured: bool = True) -> None:
        """A request ended: `overloaded` if the server said so (status, timeout); `waiting`
        if requests were queued for admission meanwhile; `measured` if its latency counts
        (a healthy reply, not a transport failure)."""
        pressed = waiting or self.in_flight >= int(self.limit)
        self.in_flight -= 1
        if overloaded:
            self._decrease(ticket)
            return
        if not measured:
            return
        latency = self._clock() - ticket.started
        self.smoothed = latency if self.smoothed is None else (
            (1 - LATENCY_ALPHA) * self.smoothed + LATENCY_ALPHA * latency)
        self.floor = self.smoothed if self.floor is None else min(self.floor * FLOOR_DRIFT, self.smoothed)
        if self.smoothed > LATENCY_FACTOR * self.floor:
            self._decrease(ticket)
            return
        if self.limit < self.threshold and self.smoothed > SLOW_START_EXIT * self.floor:
            # Latency has started to rise: doubling on would overshoot before the average
            # catches up (the queue fills faster than the EWMA sees it); go additive now.
            self.threshold = self.limit
        if pressed and not self.held:
            step = 1.0 if self.limit < self.threshold else 1.0 / self.limit
            self.limit = min(float(self.ceiling), self.limit + step)

    def server_load(self, verdict: LoadVerdict) -> None:
        """A scrape of the engine's metrics: hold while it is full, cut when it is overloaded,
        at most once per scrape and not again when another signal cut since the last one."""
        self.held = verdict.full
        if verdict.overloaded:
            self.throttled += 1
            if self.epoch == self._epoch_at_scrape:
                self._decrease(Ticket(self._clock(), self.epoch), counted=True)
        self._epoch_at_scrape = self.epoch

    def _decrease(self, ticket: Ticket, counted: bool = False) -> None:
        if not counted:
            self.throttled += 1
        if ticket.epoch != self.epoch:
            return  # sent before the last decrease: the same congestion event
        self.epoch += 1
        self.limit = max(1.0, self.limit * DECREASE)
        self.threshold = self.limit
        floor = self.floor
        if self.smoothed is not None and floor is not None and self.smoothed > LATENCY_FACTOR * floor:
            # Let the queue drain before latency is judged again: restart the average at the floor.
            self.smoothed = self.floor


_MAX_TOKENS = re.compile(
    rb'"(?:max_tokens|max_completion_tokens|max_output_tokens|maxOutputTokens)"\s*:\s*(\d+)')


def request_tokens(body: bytes) -> int:
    """A request's token cost as rate limiters count it: prompt (bytes / 4) plus output cap."""
    cap = _MAX_TOKENS.search(body)
    return len(body) // 4 + (int(cap.group(1)) if cap else 0)


_NUM = r"(\d+(?:\.\d+)?)"
_DURATION = re.compile(rf"(?:{_NUM}h)?(?:{_NUM}m(?!s))?(?:{_NUM}s)?(?:{_NUM}ms)?")


def _duration_s(value: str) -> float | None:
    """OpenAI's reset durations (`1s`, `6m0s`, `20ms`, `1h2m3.5s`) or an RFC 3339 time
    (Anthropic's `-reset`), as seconds from now."""
    value = value.strip()
    if not value:
        return None
    parts = _DURATION.fullmatch(value)
    if parts and any(parts.groups()):
        h, m, s, ms = (float(g) if g else 0.0 for g in parts.groups())
        return h * 3600 + m * 60 + s + ms / 1000
    return seconds_until(value)


def _number(headers: Mapping[str, str], name: str) -> float | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


_FAMILIES = (
    # (remaining, limit per minute, reset, unit) per header family.
    ("x-ratelimit-remaining-requests", "x-ratelimit-limit-requests", "x-ratelimit-reset-requests",
     "requests"),
    ("x-ratelimit-remaining-tokens", "x-ratelimit-limit-tokens", "x-ratelimit-reset-tokens",
     "tokens"),
    ("anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-limit",
     "anthropic-ratelimit-requests-reset", "requests"),
    ("anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-limit",
     "anthropic-ratelimit-tokens-reset", "tokens"),
    ("anthropic-ratelimit-input-tokens-remaining", "anthropic-ratelimit-input-tokens-limit",
     "anthropic-ratelimit-input-tokens-reset", "tokens"),
)


def header_pause_s(headers: Mapping[str, str], next_tokens: float) -> float:
    """How long to hold admission, from a reply's rate-limit headers: 0 while what remains
    covers one more request (one request, or `next_tokens` tokens), else until enough has
    refilled at the limit's rate, or until the reset when no limit is given."""
    pause = 0.0
    for remaining_name, limit_name, reset_name, unit in _FAMILIES:
        remaining = _number(headers, remaining_name)
        if remaining is None:
            continue
        need = 1.0 if unit == "requests" else next_tokens
        if remaining >= need:
            continue
        limit = _number(headers, limit_name)
        reset = headers.get(reset_name)
        wait: float | None = None
        if limit:
            wait = (need - remaining) / (limit / 60.0)
        if reset is not None:
            until_reset = _duration_s(reset)
            if until_reset is not None:
                wait = until_reset if wait is None else min(wait, until_reset)
        if wait is not None:
            pause = max(pause, wait)
    return pause


class Admission:
    """The gate of one (provider, model) pair in one worker: the AIMD limit, the server's
    pauses, and the declared budgets. `admit` waits (FIFO) until a request may go."""

    def __init__(
        self,
        ceiling: int,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        clock: Clock = time.monotonic,
        metrics: MetricsReader | None = None,
    ) -> None:
        self.controller = AimdController(ceiling, clock)
        self.metrics = metrics
        """The engine's `/metrics` reader (`provider.server_metrics`), or None."""
        self._clock = clock
        self._last_scrape = -math.inf
        self._scraping: asyncio.Task[None] | None = None
        self.requests = (TokenBucket(requests_per_minute / 60.0, max(1.0, requests_per_minute / 60.0), clock)
                         if requests_per_minute else None)
        """Per-second refill, a one-second burst (at least one request)."""
        self.tokens = (TokenBucket(tokens_per_minute / 60.0, tokens_per_minute / 60.0, clock)
                       if tokens_per_minute else None)
        self.waiting = 0
        self.last_tokens = 0.0
        """The estimated cost of the latest request: what the next one is assumed to need."""
        self._cond: asyncio.Condition | None = None

    def _delay(self, tokens: float) -> float:
        delay = self.controller.pause_left()
        if self.requests is not None:
            delay = max(delay, self.requests.delay(1))
        if self.tokens is not None:
            delay = max(delay, self.tokens.delay(tokens))
        return delay

    async def admit(self, tokens: float) -> Ticket:
        """Wait for room, spend the budgets, and return the request's ticket."""
        if self._cond is None:
            self._cond = asyncio.Condition()
        cond = self._cond
        async with cond:
            while True:
                delay = self._delay(tokens)
                if delay <= 0 and self.controller.has_room():
                    break
                self.waiting += 1
                try:
                    if delay > 0:
                        with contextlib.suppress(TimeoutError):  # the pause is over: look again
                            await asyncio.wait_for(cond.wait(), delay)
                    else:
                        await cond.wait()
                finally:
                    self.waiting -= 1
            if self.requests is not None:
                self.requests.take(1)
            if self.tokens is not None:
                self.tokens.take(tokens)
            self.last_tokens = tokens
            return self.controller.start()

    async def release(
        self, ticket: Ticket, status: int | None, headers: Mapping[str, str] | None, timed_out: bool
    ) -> None:
        """A request ended with `status` (None: no reply, a transport failure)."""
        assert self._cond is not None
        async with self._cond:
            overloaded = timed_out or status in OVERLOAD_STATUSES
            try:
                if headers is not None:
                    wait = header_retry_after_s(headers) if overloaded else None
                    if wait is not None:
                        self.controller.pause(wait)
                    self.controller.pause(header_pause_s(headers, self.last_tokens))
            finally:
                # The slot is given back whatever the headers held: a reply the gate cannot
                # read must not keep its place for the rest of the run.
                self.controller.done(ticket, overloaded, waiting=self.waiting > 0,
                                     measured=status is not None and status < 300)
                self._cond.notify(max(1, int(self.controller.limit) - self.controller.in_flight))
        self._maybe_scrape()

    def _maybe_scrape(self) -> None:
        """Start a scrape of the engine's metrics when one is due and none is running."""
        reader = self.metrics
        if reader is None or reader.stopped or self._scraping is not None:
            return
        now = self._clock()
        if now - self._last_scrape < SCRAPE_INTERVAL_S:
            return
        self._last_scrape = now
        self._scraping = asyncio.get_running_loop().create_task(self._scrape(reader))

    async def _scrape(self, reader: MetricsReader) -> None:
        try:
            verdict = await reader.scrape()
            if verdict is None and reader.stopped:
                self.controller.held = False  # no more readings: the other signals rule alone
            if verdict is not None and self._cond is not None:
                async with self._cond:
                    self.controller.server_load(verdict)
                    self._cond.notify(max(1, int(self.controller.limit) - self.controller.in_flight))
        finally:
            self._scraping = None

    async def aclose(self) -> None:
        """Stop a scrape in progress (the worker is closing its clients)."""
        task, self._scraping = self._scraping, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class _TrackedStream(httpx.AsyncByteStream):
    """A reply's body stream that tells its `Admission` when it is done (the request held its
    place until the last byte: the server was busy with it until then)."""

    def __init__(self, inner: httpx.AsyncByteStream, on_close: Callable[[bool], object]) -> None:
        self._inner = inner
        self._on_close = on_close
        self._timed_out = False
        self._closed = False

    async def __aiter__(self):  # type: ignore[no-untyped-def]  # httpx's own signature
        try:
            async for chunk in self._inner:
                yield chunk
        except httpx.TimeoutException:
            self._timed_out = True
            raise

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if not self._closed:
                self._closed = True
                result = self._on_close(self._timed_out)
                if asyncio.iscoroutine(result):
                    await result


class AdmissionTransport(httpx.AsyncBaseTransport):
    """An httpx transport that passes every request through an `Admission` first."""

    def __init__(self, inner: httpx.AsyncBaseTransport, admission: Admission) -> None:
        self._inner = inner
        self.admission = admission

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        gate = self.admission
        # Needed by the declared token budget and by the rate-limit headers' pause alike.
        tokens = float(request_tokens(request.content))
        ticket = await gate.admit(tokens)
        try:
            response = await self._inner.handle_async_request(request)
        except httpx.TimeoutException:
            await gate.release(ticket, None, None, timed_out=True)
            raise
        except BaseException:
            await gate.release(ticket, None, None, timed_out=False)
            raise
        status, headers = response.status_code, response.headers

        async def close(timed_out: bool) -> None:
            await gate.release(ticket, None if timed_out else status, headers, timed_out)

        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _TrackedStream(response.stream, close)
        return response

    async def aclose(self) -> None:
        await self.admission.aclose()
        await self._inner.aclose()


def admission_gauges(gates: Mapping[object, Admission]) -> dict[str, int]:
    """What the progress line shows of a worker's gates: requests in flight, their limits
    summed, the overload signals seen, and the requests waiting for admission."""
    return {
        "admission.in_flight": sum(g.controller.in_flight for g in gates.values()),
        "admission.limit": sum(int(g.controller.limit) for g in gates.values()),
        "admission.throttled": sum(g.controller.throttled for g in gates.values()),
        "admission.waiting": sum(g.waiting for g in gates.values()),
    }
