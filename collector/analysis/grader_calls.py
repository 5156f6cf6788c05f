"""Calling an environment's grader for `collector regrade`: a deadline for every grader, one
line for every failure.

A grader is the environment's code: it may hang, raise, or return something that is not a
reward. The regrade is asked one episode at a time (`GraderThread.grade`), and:

- every call has a deadline, whatever the grader is. `Environment.regrade` awaits an async
  grader and its replayed tools under their own bounds, but a synchronous grader (or tool)
  blocks the event loop it runs on, and no bound set inside that loop can stop it. So the
  episodes are graded on an event loop in a thread of their own, and the regrade waits for
  each with its deadline from outside: past it, the thread is abandoned (a daemon thread: it
  does not hold the process's exit) and the episode is named in one line. Nothing in Python
  can stop a running synchronous function; abandoning its thread is what a deadline can do.
- a grader that raises, or returns None, a string, a bool, NaN, an infinity or an integer too
  large for a float, is one line naming the episode and the cause (`OutputError`), never a
  traceback without the episode, nor an empty message.
  It is an `OutputError`: the CLI prints it as ``collector: error: episode ...`` and exits 2.
  The grader's own message is shown (whitespace folded, at most 200 characters) with every
  credential the environment declares (`Environment.credentials()`) replaced.

Tests: tests/analysis/test_regrade_faults.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import re
import threading
from collections.abc import Coroutine, Iterable
from typing import Any

from collector.errors import OutputError
from collector.turn import REDACTED_CREDENTIAL

__all__ = ["GraderThread", "reward_of"]


def _shown(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def reward_of(value: object) -> float:
    """`value` as a reward, or ValueError saying why it is none (one line, the value shown short)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"returned {_shown(value)} ({type(value).__name__}), not a number")
    try:
        reward = float(value)
    except OverflowError:
        raise ValueError(f"returned {_shown(value)}, too large for a reward") from None
    if not math.isfinite(reward):
        raise ValueError(f"returned {reward}, not a finite number")
    return reward


def _cause(e: BaseException) -> str:
    text = " ".join(str(e).split())  # one line, whatever the grader put in its message
    if len(text) > 200:
        text = text[:197] + "..."
    return f"raised {type(e).__name__}" + (f": {text}" if text else "")


class GraderThread:
    """An event loop in a daemon thread that grades one episode at a time under a deadline."""

    def __init__(self, credentials: Iterable[str] = ()) -> None:
        forms = sorted({c for c in credentials if c}, key=len, reverse=True)
        # The environment's own secrets (`Environment.credentials()`): never in a failure line.
        self._secrets = re.compile("|".join(map(re.escape, forms))) if forms else None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="regrade-grader", daemon=True)
        self._thread.start()
        self._stuck = False

    def grade(self, episode_id: str, call: Coroutine[Any, Any, object], deadline_s: float,
              bound_s: float) -> float:
        """The reward `call` (one episode's `Environment.regrade`, whose own steps are bounded by
        `bound_s` each) returns within `deadline_s`; OutputError naming `episode_id` otherwise."""
        try:
            return self._grade(episode_id, call, deadline_s, bound_s)
        except OutputError as e:
            text = str(e) if self._secrets is None else self._secrets.sub(REDACTED_CREDENTIAL, str(e))
            raise OutputError(text) from None

    def _grade(self, episode_id: str, call: Coroutine[Any, Any, object], deadline_s: float,
               bound_s: float) -> float:
        if self._stuck:
            call.close()
            raise OutputError(f"episode {episode_id}: not graded, an earlier grader is still running")
        future = asyncio.run_coroutine_threadsafe(call, self._loop)
        try:
            value = future.result(timeout=deadline_s)
        except TimeoutError as e:
            if future.done():  # raised by the call: an async grader (or a tool) past its own bound
                raise OutputError(f"episode {episode_id}: the grader did not finish within its {bound_s:g} s "
                                  "bound") from e
            future.cancel()  # an async grader stops here; a synchronous one keeps the thread: abandoned
            self._stuck = True
            raise OutputError(f"episode {episode_id}: the grader did not finish within {deadline_s:g} s "
                              "(abandoned)") from None
        except concurrent.futures.CancelledError:
            raise OutputError(f"episode {episode_id}: the grader was cancelled") from None
        except Exception as e:
            raise OutputError(f"episode {episode_id}: the grader {_cause(e)}") from e
        try:
            return reward_of(value)
        except ValueError as e:
            raise OutputError(f"episode {episode_id}: the grader {e}") from None

    def close(self) -> None:
        """Stop the loop (unless a grader holds it: then the daemon thread is left behind)."""
        if self._stuck:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
