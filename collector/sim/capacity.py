"""A simulated server's capacity: N requests served at once, a FIFO queue, refusals past it.

Real servers push back in two ways, and a preset can have either (`ModelPreset.capacity`):

- a hosted API meters tokens per minute: each request is charged at arrival its prompt
  tokens plus the output cap it asks for (as OpenAI's limiter counts), from a bucket that
  refills continuously and holds `burst_s` seconds of budget; a request the bucket cannot
  pay is answered 429 with `retry-after-ms` / `retry-after` saying when it could be, and
  every reply carries `x-ratelimit-{limit,remaining,reset}-tokens`, as OpenAI's do;
- a GPU server (vLLM, SGLang) runs at most `slots` sequences at once, and only as many as
  its KV cache holds (`kv_tokens`: the running requests' prompt + output tokens); the rest
  wait in a FIFO queue, and the wait is real latency (the server is slow, so the sleep is on
  this side). Past `queue_limit` waiting, a request is refused at once with
  `refuse_status` (503 for an overloaded GPU server, vLLM's answer when its queue is full;
  429 for a hosted API's concurrency limit). Each sequence in the batch also slows the
  others (`slowdown`): the service time is ``latency x (1 + slowdown x running / slots)``,
  so throughput grows with the batch until the slots are full and not past them.

Mid-request preemption (vLLM recomputing a sequence evicted from the KV cache) is not
modelled: a request that would not fit waits instead, which costs the client the same
latency without the recomputation.

`GET /metrics` publishes each model's load the way vLLM does (`vllm_metrics`): requests
running and waiting, the KV cache's use, and a preemption counter that stays 0 (none are
modelled), so a client reading an engine's metrics (`provider.server_metrics = "vllm"`)
can be tested against it.

Everything here runs in the simulator's event loop; one `CapacityModel` per preset per app
(`collector.sim.app`), created on its first request.

Tests: tests/sim/test_capacity.py.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Capacity", "CapacityModel", "Refusal", "vllm_metrics"]


@dataclass(frozen=True, slots=True)
class Capacity:
    """How much a simulated server takes before it queues and refuses."""

    slots: int = 64
    """Requests served concurrently."""
    queue_limit: int = 64
    """Requests waiting for a slot; one more is refused at once."""
    refuse_status: int = 503
    """The status of a refusal past the queue: 503 (overloaded) or 429 (concurrency limit)."""
    refuse_retry_after_s: float | None = None
    """`retry-after` of a queue refusal (None: the reply has none, the client backs off)."""
    slowdown: float = 0.0
    """Batching cost: service time x (1 + slowdown x running / slots)."""
    kv_tokens: int | None = None
    """KV-cache budget in tokens: running requests' prompt + output must fit (None: no limit)."""
    tokens_per_minute: int | None = None
    """Token budget charged at arrival (prompt + cap); None: no rate limit."""
    burst_s: float = 1.0
    """The token bucket holds this many seconds of `tokens_per_minute`."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the server will not serve now: the status and the headers to send."""

    status: int
    retry_after_s: float | None
    headers: dict[str, str]
    message: str


class CapacityModel:
    """The live state of one server's capacity: running requests, the queue, the bucket."""

    def __init__(self, capacity: Capacity, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self.running = 0
        self.kv_used = 0
        self.queue: deque[tuple[asyncio.Future[None], int]] = deque()
        self.refused = 0
        self.served = 0
        self.peak_queue = 0
        self._clock = clock
        tpm = capacity.tokens_per_minute
        self._rate = tpm / 60.0 if tpm else 0.0
        self._bucket_size = self._rate * capacity.burst_s
        self._level = self._bucket_size
        self._at = clock()

    # --- the token budget ---------------------------------------------------------------

    def _refill(self) -> None:
        now = self._clock()
        self._level = min(self._bucket_size, self._level + (now - self._at) * self._rate)
        self._at = now

    def _rate_headers(self) -> dict[str, str]:
        if not self._rate:
            return {}
        tpm = self.capacity.tokens_per_minute
        reset = max(0.0, (self._bucket_size - self._level) / self._rate)
        return {"x-ratelimit-limit-tokens": str(tpm),
                "x-ratelimit-remaining-tokens": str(max(0, math.floor(self._level))),
                "x-ratelimit-reset-tokens": f"{reset:.3f}s"}

    def charge(self, tokens: int) -> Refusal | None:
        """Charge `tokens` to the budget, or the 429 that says when they could be paid."""
        if not self._rate:
            return None
        self._refill()
        need = min(tokens, self._bucket_size)
        if self._level < need:
            wait = (need - self._level) / self._rate
            headers = {**self._rate_headers(), "retry-after-ms": str(max(1, math.ceil(wait * 1000))),
                       "retry-after": str(max(1, math.ceil(wait)))}
            self.refused += 1
            return Refusal(429, wait, headers, "Rate limit reached for tokens per minute. Please try again.")
        self._level -= tokens
        return None

    # --- slots and the queue ------------------------------------------------------------

    def _fits(self, kv: int) -> bool:
        cap = self.capacity
        if self.running >= cap.slots:
            return False
        # An empty server takes any request (a prompt over the KV cache is a 400 elsewhere).
        return cap.kv_tokens is None or self.running == 0 or self.kv_used + kv <= cap.kv_tokens

    async def acquire(self, kv: int) -> Refusal | None:
        """Take a slot (waiting in the FIFO queue for one), or the refusal past the queue."""
        if not self.queue and self._fits(kv):
            self._start(kv)
            return None
        cap = self.capacity
        if len(self.queue) >= cap.queue_limit:
            self.refused += 1
            headers = self._rate_headers()
            wait = cap.refuse_retry_after_s
            if wait is not None:
                headers |= {"retry-after-ms": str(math.ceil(wait * 1000)),
                            "retry-after": str(max(1, math.ceil(wait)))}
            return Refusal(cap.refuse_status, wait, headers,
                           "The server is overloaded. Please try again later.")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.queue.append((waiter, kv))
        self.peak_queue = max(self.peak_queue, len(self.queue))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(kv)  # the slot was granted as the client went away
            else:
                self.queue.remove((waiter, kv))
            raise
        return None

    def _start(self, kv: int) -> None:
        self.running += 1
        self.kv_used += kv

    def release(self, kv: int) -> None:
        """A request is done: free its slot and start the queued ones that now fit (FIFO)."""
        self.running -= 1
        self.kv_used -= kv
        self.served += 1
        while self.queue and self._fits(self.queue[0][1]):
            waiter, queued_kv = self.queue.popleft()
            if waiter.done():
                continue
            self._start(queued_kv)
            waiter.set_result(None)

    def service_s(self, latency_s: float) -> float:
        """How long a request takes with the batch as it is now."""
        cap = self.capacity
        return latency_s * (1.0 + cap.slowdown * self.running / cap.slots)

    async def serve(self, latency_s: float, prompt_tokens: int, cap_tokens: int,
                    output_tokens: int) -> Refusal | dict[str, str]:
        """Serve one request: charge the budget, wait for a slot, take the service time.
        Returns the refusal, or the rate-limit headers for the reply."""
        refusal = self.charge(prompt_tokens + cap_tokens)
        if refusal is not None:
            return refusal
        kv = prompt_tokens + output_tokens
        refusal = await self.acquire(kv)
        if refusal is not None:
            return refusal
        try:
            await asyncio.sleep(self.service_s(latency_s))
        finally:
            self.release(kv)
        if self._rate:
            self._refill()
        return self._rate_headers()


_VLLM_GAUGES = (
    ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    ("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine."),
)


def vllm_metrics(models: dict[str, CapacityModel]) -> str:
    """Prometheus text of each model's load, with vLLM's names and `model_name` label."""
    lines: list[str] = []
    for name, kind, help_text in _VLLM_GAUGES:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for model, cap in sorted(models.items()):
            budget = cap.capacity.kv_tokens
            usage = cap.kv_used / budget if budget else cap.running / cap.capacity.slots
            value = {"vllm:num_requests_running": float(cap.running),
                     "vllm:num_requests_waiting": float(len(cap.queue)),
                     "vllm:kv_cache_usage_perc": usage,
                     "vllm:num_preemptions_total": 0.0}[name]
            lines.append(f'{name}{{engine="0",model_name="{model}"}} {value}')
    return "\n".join(lines) + "\n"
