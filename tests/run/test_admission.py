"""Adaptive admission, fed events: the AIMD limit, the token bucket, the rate-limit headers,
the gate around a transport, and the progress line's gauges (no server, no sleeps)."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import httpx
import pytest

from collector.run.admission import (
    DECREASE,
    Admission,
    AdmissionTransport,
    AimdController,
    TokenBucket,
    admission_gauges,
    header_pause_s,
    request_tokens,
)
from collector.run.progress import LiveCounts, Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def complete(ctl: AimdController, clock: Clock, latency: float = 0.1, overloaded: bool = False) -> None:
    """One request admitted and finished after `latency`, with the limit pressed."""
    ticket = ctl.start()
    clock.now += latency
    ctl.done(ticket, overloaded, waiting=True)


def test_slow_start_then_additive_increase() -> None:
    """The limit doubles per round trip until the first overload, then grows ~1 per round."""
    clock = Clock()
    ctl = AimdController(64, clock, initial=2)
    for _ in range(6):
        complete(ctl, clock)
    assert ctl.limit == 8.0  # +1 per healthy completion in slow start
    complete(ctl, clock, overloaded=True)
    assert ctl.limit == pytest.approx(8.0 * DECREASE)
    before = ctl.limit
    complete(ctl, clock)
    assert ctl.limit == pytest.approx(before + 1.0 / before)  # additive: 1/limit per reply


def test_one_decrease_per_congestion_event() -> None:
    """Requests sent before a decrease do not cut the limit again when their 429s arrive."""
    clock = Clock()
    ctl = AimdController(64, clock, initial=20)
    tickets = [ctl.start() for _ in range(10)]
    for t in tickets:
        ctl.done(t, overloaded=True)
    assert ctl.limit == pytest.approx(20 * DECREASE)
    assert ctl.throttled == 10  # every signal is counted for the progress line
    complete(ctl, clock, overloaded=True)  # sent after the decrease: a new event
    assert ctl.limit == pytest.approx(20 * DECREASE * DECREASE)


def test_latency_past_the_bound_decreases() -> None:
    """Smoothed latency past LATENCY_FACTOR x its floor is an overload signal (queueing)."""
    clock = Clock()
    ctl = AimdController(64, clock, initial=10)
    for _ in range(20):
        complete(ctl, clock, latency=0.1)
    grown = ctl.limit
    assert ctl.throttled == 0
    for _ in range(40):
        complete(ctl, clock, latency=0.5)
        if ctl.throttled:
            break
    assert ctl.throttled == 1
    assert ctl.limit < grown


def test_ceiling_floor_and_unpressed_limit() -> None:
    """The static setting caps the limit, it never falls under 1, and a limit nobody presses
    against does not grow."""
    clock = Clock()
    ctl = AimdController(4, clock, initial=2)
    for _ in range(10):
        complete(ctl, clock)
    assert ctl.limit == 4.0
    for _ in range(10):
        complete(ctl, clock, overloaded=True)
    assert ctl.limit == 1.0
    ticket = ctl.start()
    ctl.done(ticket, overloaded=False, waiting=False)  # 1 in flight of limit 1: pressed
    assert ctl.limit == 2.0
    ticket = ctl.start()
    ctl.done(ticket, overloaded=False, waiting=False)  # 1 in flight of limit 2: not pressed
    assert ctl.limit == 2.0


def test_token_bucket_with_injected_clock() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=10.0, capacity=20.0, clock=clock)
    assert bucket.delay(20) == 0.0
    bucket.take(20)
    assert bucket.delay(5) == pytest.approx(0.5)
    clock.now += 0.5
    assert bucket.delay(5) == 0.0
    bucket.take(30)  # larger than the burst: goes, the level goes negative
    assert bucket.delay(1) == pytest.approx(2.6)
    assert bucket.delay(500) == pytest.approx(4.5)  # never more than the burst needs
    with pytest.raises(ValueError, match="positive rate"):
        TokenBucket(0, 1)


def test_rate_limit_headers_pause() -> None:
    """OpenAI's and Anthropic's headers: pause while what remains cannot pay the next request."""
    openai = {"x-ratelimit-limit-tokens": "60000", "x-ratelimit-remaining-tokens": "100",
              "x-ratelimit-reset-tokens": "6m0s"}
    assert header_pause_s(openai, next_tokens=100) == 0.0
    assert header_pause_s(openai, next_tokens=600) == pytest.approx(0.5)  # 500 at 1000/s
    no_limit = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1.5s"}
    assert header_pause_s(no_limit, next_tokens=1) == pytest.approx(1.5)
    assert header_pause_s({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "20ms"},
                          1) == pytest.approx(0.02)
    anthropic = {"anthropic-ratelimit-tokens-remaining": "0",
                 "anthropic-ratelimit-tokens-reset": "2000-01-01T00:00:00Z"}
    assert header_pause_s(anthropic, next_tokens=10) == 0.0  # a reset in the past: no wait
    assert header_pause_s({"x-ratelimit-remaining-tokens": "junk"}, 10) == 0.0


def test_request_tokens_counts_prompt_and_cap() -> None:
    body = b'{"model":"m","max_completion_tokens": 256,"messages":[]}'
    assert request_tokens(body) == len(body) // 4 + 256
    gemini = b'{"generationConfig":{"maxOutputTokens":64}}'
    assert request_tokens(gemini) == len(gemini) // 4 + 64
    assert request_tokens(b"{}") == 0


def test_transport_pauses_on_retry_after_and_counts() -> None:
    """A 429 with retry-after-ms pauses the whole gate and cuts the limit; a 200 grows it."""
    clock = Clock()
    # Streamed bodies, as a real transport gives them (a body given whole is never closed).
    replies = iter([httpx.Response(429, headers={"retry-after-ms": "1500"}, stream=httpx.ByteStream(b"{}")),
                    httpx.Response(200, stream=httpx.ByteStream(b"{}"))])
    gate = Admission(8, clock=clock)
    transport = AdmissionTransport(httpx.MockTransport(lambda request: next(replies)), gate)

    async def go() -> None:
        async with httpx.AsyncClient(transport=transport) as client:
            first = await client.post("http://sim/v1/chat/completions", content=b"{}")
            assert first.status_code == 429
            assert gate.controller.pause_left() == pytest.approx(1.5)
            assert gate.controller.throttled == 1
            assert gate.controller.in_flight == 0
            clock.now += 1.5  # the pause is over on the injected clock: admitted at once
            second = await client.post("http://sim/v1/chat/completions", content=b"{}")
            assert second.status_code == 200

    asyncio.run(go())
    assert gate.controller.in_flight == 0
    gauges = admission_gauges({"k": gate})
    assert gauges["admission.throttled"] == 1
    assert gauges["admission.in_flight"] == 0


def test_transport_timeout_is_an_overload_signal() -> None:
    gate = Admission(8)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    async def go() -> None:
        async with httpx.AsyncClient(transport=AdmissionTransport(httpx.MockTransport(slow), gate)) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post("http://sim/x", content=b"{}")

    asyncio.run(go())
    assert gate.controller.throttled == 1
    assert gate.controller.in_flight == 0


def test_gate_holds_requests_past_the_limit() -> None:
    """With the limit at 1, a second request waits until the first one's reply is closed."""
    gate = Admission(1)
    gate.controller.limit = 1.0

    async def go() -> None:
        first = await gate.admit(1)
        second = asyncio.ensure_future(gate.admit(1))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not second.done()
        assert gate.waiting == 1
        await gate.release(first, 200, {}, timed_out=False)
        ticket = await asyncio.wait_for(second, 5)
        await gate.release(ticket, 200, {}, timed_out=False)

    asyncio.run(go())
    assert gate.controller.in_flight == 0
    assert gate.waiting == 0


def test_progress_line_shows_admission_gauges() -> None:
    """A worker's `admission.*` keys are gauges, never stop reasons or part of the total."""
    live = LiveCounts()
    live.reported("w1", {"done": 3, "admission.in_flight": 5, "admission.limit": 8, "admission.throttled": 2,
                         "admission.waiting": 7})
    live.reported("w2", {"done": 1, "admission.in_flight": 1, "admission.limit": 4, "admission.throttled": 0,
                         "admission.waiting": 0})
    counts = live.counts(["w1", "w2"])
    assert dict(counts) == {"done": 4}
    assert counts.total() == 4
    progress = Progress(10, stream=io.StringIO(), live=False)
    line = progress.line(0, counts, finished=counts.total())
    assert "in flight 6/12 throttled 2 queued 7" in line
    static = LiveCounts()
    static.reported("w1", {"done": 3})
    assert "in flight" not in progress.line(0, static.counts(["w1"]), finished=3)


def test_declared_budgets_delay_admission() -> None:
    """`requests_per_minute` / `tokens_per_minute` are buckets: spent, the next request waits."""
    clock = Clock()
    by_tokens = Admission(8, requests_per_minute=600, tokens_per_minute=300, clock=clock)  # 10 req/s, 5 tok/s
    by_requests = Admission(8, requests_per_minute=60, clock=clock)  # 1 req/s

    async def go() -> None:
        for gate in (by_tokens, by_requests):
            ticket = await gate.admit(5)
            await gate.release(ticket, 200, {}, timed_out=False)
        assert by_tokens._delay(5) == pytest.approx(1.0)  # 5 tokens short at 5 a second
        assert by_requests._delay(5) == pytest.approx(1.0)  # one request a second
        clock.now += 0.5
        assert by_tokens._delay(5) == pytest.approx(0.5)
        assert by_requests._delay(5) == pytest.approx(0.5)
        clock.now += 0.5
        assert by_tokens._delay(5) == 0.0
        assert by_requests._delay(5) == 0.0

    asyncio.run(go())


def test_reset_times_and_retry_after_dates() -> None:
    """Anthropic's RFC 3339 reset and an HTTP-date retry-after, both as seconds from now."""
    import email.utils
    from datetime import UTC, datetime, timedelta

    soon = datetime.now(UTC) + timedelta(seconds=30)
    anthropic = {"anthropic-ratelimit-requests-remaining": "0",
                 "anthropic-ratelimit-requests-reset": soon.isoformat().replace("+00:00", "Z")}
    assert 25 < header_pause_s(anthropic, 1) <= 30
    clock = Clock()
    gate = Admission(8, clock=clock)
    date = email.utils.format_datetime(soon, usegmt=True)
    replies = iter([httpx.Response(503, headers={"retry-after": date}, stream=httpx.ByteStream(b""))])
    transport = AdmissionTransport(httpx.MockTransport(lambda request: next(replies)), gate)

    async def go() -> None:
        async with httpx.AsyncClient(transport=transport) as client:
            assert (await client.post("http://sim/x", content=b"{}")).status_code == 503

    asyncio.run(go())
    assert 25 < gate.controller.pause_left() <= 30


class _StallingStream(httpx.AsyncByteStream):
    async def __aiter__(self):  # type: ignore[no-untyped-def]
        yield b"{"
        raise httpx.ReadTimeout("stalled")

    async def aclose(self) -> None:
        return None


def test_a_body_that_stalls_is_a_timeout_signal() -> None:
    """A reply whose body stops arriving (the idle limit) counts as overload when it closes."""
    gate = Admission(8)
    transport = AdmissionTransport(
        httpx.MockTransport(lambda request: httpx.Response(200, stream=_StallingStream())), gate)

    async def go() -> None:
        async with httpx.AsyncClient(transport=transport) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post("http://sim/x", content=b"{}")

    asyncio.run(go())
    assert gate.controller.throttled == 1
    assert gate.controller.in_flight == 0


def test_adaptive_admission_refuses_the_httpx_client(tmp_path: Path) -> None:
    """Adaptive admission wraps the fast transport; with httpx's own it says so in one line."""
    from collector.errors import ConfigError
    from tests.run.helpers import small_config
    from tests.run.test_worker import run_plan

    cfg = small_config(tmp_path / "run", ray__admission="adaptive", provider__http_client="httpx")
    with pytest.raises(ConfigError, match=r'^ray.admission = "adaptive" needs provider.http_client = "fast"'):
        run_plan(cfg)


def test_a_healthy_reply_with_nothing_left_pauses_the_gate() -> None:
    """A 200 whose x-ratelimit headers say the tokens are spent holds the next request back."""
    clock = Clock()
    gate = Admission(8, clock=clock)
    headers = {"x-ratelimit-limit-tokens": "6000", "x-ratelimit-remaining-tokens": "0"}  # 100 tokens/s
    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=headers, stream=httpx.ByteStream(b"{}"))

    transport = AdmissionTransport(httpx.MockTransport(reply), gate)
    body = b'{"max_tokens": 50}'  # 4 + 50 tokens for the next request, as it is assumed

    async def go() -> None:
        async with httpx.AsyncClient(transport=transport) as client:
            assert (await client.post("http://sim/x", content=body)).status_code == 200

    asyncio.run(go())
    assert gate.controller.pause_left() == pytest.approx(request_tokens(body) / 100)
    assert gate.controller.throttled == 0
