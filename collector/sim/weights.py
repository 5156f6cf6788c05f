"""The simulator's weights: a version that can change mid-run, aborting what is in flight.

An RL trainer swaps a server's weights between steps. vLLM and SGLang then abort the
requests they are generating: the reply comes back with `finish_reason: "abort"` (a 200,
the partial output so far, never a cut by the cap). SGLang reports the version that
answered (`metadata.weight_version` on a non-streamed Chat reply; `GET /model_info`, formerly
`GET /get_weight_version`); vLLM reports none. This module is that state, for one app:

- `version` starts at `"v0"`; `swap(version)` sets a new one (default `v<n+1>`) and aborts
  every request in flight;
- `arm(when_in_flight, version)`: a swap that fires the moment `when_in_flight` chat
  requests are in flight at once, so a test swaps on an event proving requests are being
  generated, never on a timer. While a swap is armed, a request that arrives is held until
  the swap fires (then it is aborted) or `HOLD_LIMIT_S` passes (then it is answered): the
  in-flight count can reach the mark without any latency setting. Armed swaps fire in
  order, one per mark reached;
- `every`: a schedule, a swap after every N answered chat requests (the preset-free way to
  get versions that change during a long run).

Control endpoints (registered by `collector.sim.app`): `GET /sim/weights` (version, in
flight, answered per version, aborted), `POST /sim/weights` with `{"version": "v1"}` (swap
now), `{"when_in_flight": 3, "version": "v1"}` (arm), or `{"every": 10}` (schedule), and
`GET /model_info` and `GET /get_weight_version` with SGLang's `weight_version` field.
Only the Chat wire aborts and reports a version: the other three are hosted APIs, which
swap weights without telling anyone.

Tests: tests/sim/test_weights.py, tests/run/test_policy_swap.py.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HOLD_LIMIT_S", "Weights"]

HOLD_LIMIT_S = 60.0
"""Longest a request waits for an armed swap: with fewer clients than the mark, it is answered.
Generous on purpose: on a loaded machine the clients that reach the mark may be seconds apart,
and a swap that never fires would turn a fault test into a timing guess."""


@dataclass(slots=True)
class _Armed:
    when_in_flight: int
    version: str | None


@dataclass(slots=True)
class Weights:
    """One app's weight version, its in-flight requests and its armed swaps."""

    version: str = "v0"
    swaps: int = 0
    every: int | None = None
    answered: Counter[str] = field(default_factory=Counter)
    """Chat requests answered (not aborted), per version that answered them."""
    aborted: int = 0
    _since_swap: int = 0
    _in_flight: set[asyncio.Event] = field(default_factory=set)
    _armed: list[_Armed] = field(default_factory=list)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def swap(self, version: str | None = None) -> int:
        """A new version now; every request in flight is aborted. Returns how many were."""
        self.swaps += 1
        self.version = version or f"v{self.swaps}"
        self._since_swap = 0
        aborted = len(self._in_flight)
        for event in self._in_flight:
            event.set()
        self._in_flight.clear()
        return aborted

    def arm(self, when_in_flight: int, version: str | None = None) -> None:
        """A swap that fires when `when_in_flight` requests are in flight (after earlier ones)."""
        self._armed.append(_Armed(when_in_flight, version))

    async def generate(self, latency_s: float) -> tuple[str, bool]:
        """Wait out a request's latency as one generation: the version it was generated
        with, and whether a swap aborted it meanwhile."""
        version = self.version
        wait = latency_s
        if self._armed:
            wait = max(wait, HOLD_LIMIT_S)  # held for the armed swap
        if wait <= 0:
            return self._answered(version), False
        aborted = asyncio.Event()
        self._in_flight.add(aborted)
        if self._armed and len(self._in_flight) >= self._armed[0].when_in_flight:
            self.swap(self._armed.pop(0).version)
        else:
            try:
                async with asyncio.timeout(wait):
                    await aborted.wait()
            except TimeoutError:
                pass  # generated in full: answered by the version it started with
        if aborted.is_set():
            self.aborted += 1
            return version, True
        self._in_flight.discard(aborted)
        return self._answered(version), False

    def _answered(self, version: str) -> str:
        self.answered[version] += 1
        self._since_swap += 1
        if self.every is not None and self._since_swap >= self.every:
            self.swap()
        return version

    def state(self) -> dict[str, Any]:
        """What `GET /sim/weights` answers."""
        return {"weight_version": self.version, "swaps": self.swaps, "in_flight": self.in_flight,
                "answered": dict(self.answered), "aborted": self.aborted,
                "armed": len(self._armed), "every": self.every}

    def control(self, body: Any) -> dict[str, Any]:
        """`POST /sim/weights`: swap now, arm a swap, or set the schedule. ValueError if bad."""
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        version = body.get("version")
        if version is not None and (not isinstance(version, str) or not version):
            raise ValueError("version must be a non-empty string")
        unknown = set(body) - {"version", "when_in_flight", "every"}
        if unknown:
            raise ValueError(f"unknown field {sorted(unknown)[0]!r}")
        if "every" in body:
            every = body["every"]
            if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
                raise ValueError("every must be a positive integer or null")
            self.every = every
            return self.state()
        mark = body.get("when_in_flight")
        if mark is not None:
            if not isinstance(mark, int) or isinstance(mark, bool) or mark < 1:
                raise ValueError("when_in_flight must be a positive integer")
            self.arm(mark, version)
            return self.state()
        state = self.state()
        state["aborted_now"] = self.swap(version)
        state.update(weight_version=self.version, swaps=self.swaps)
        return state
