"""A progress line for `collector run`: episodes finished and committed, rate, ETA, live counts.

Plain text on stderr, no dependency: on a terminal one line is rewritten in place (at most a
few times a second); when stderr is a file or a pipe (CI logs, `tee`, a test reading it) a
full line is printed every `log_interval_s`, so logs stay readable and grep-able. The counts
per stop reason are the point: a sweep whose `length` count climbs is visible long before
the table at the end.

Episodes are counted as workers finish them, not as they are committed (a shard holds many,
and a batch returns to the driver only when all of its episodes are done): `LiveCounts` adds
what each worker reports having finished to what the driver already holds. Display only:
nothing here decides what is committed.

With adaptive admission (`ray.admission = "adaptive"`) each worker's poll answer also holds
its gates' gauges under `admission.*` keys (`collector.run.admission.admission_gauges`):
`LiveCounts` sets them apart from the stop reasons, sums them over the live workers, and
the line shows `in flight N/LIMIT` (requests in flight and the adapted limits, summed),
`throttled K` (overload signals seen) and `queued Q` (requests waiting for admission).

Tests: tests/run/test_progress.py.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TextIO

#: The order stop reasons are shown in: outcomes first, faults after, failures last.
_ORDER = ("done", "max_steps", "length", "malformed_tool_call", "timeout", "error")


def format_counts(counts: Mapping[str, int]) -> str:
    """`done 12 length 3 ...` in a stable order, zero counts left out."""
    keys = [k for k in _ORDER if counts.get(k)] + sorted(k for k in counts if k not in _ORDER and counts[k])
    return " ".join(f"{k} {counts[k]}" for k in keys)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


ADMISSION_PREFIX = "admission."
"""Keys of a worker's poll answer that are admission gauges, not stop reasons."""


class Tally(Counter[str]):
    """Finished episodes per stop reason, with the workers' admission gauges beside them
    (`gauges`, empty with static admission): never mixed into the counts or their total."""

    gauges: dict[str, int]

    def __init__(
        self, counts: Mapping[str, int] | None = None, gauges: Mapping[str, int] | None = None
    ) -> None:
        super().__init__(counts or {})
        self.gauges = dict(gauges or {})


def format_admission(gauges: Mapping[str, int]) -> str:
    """`in flight 12/16 throttled 3 queued 40`, or "" with no gauges (static admission)."""
    if not gauges:
        return ""
    text = f"in flight {gauges.get('in_flight', 0)}/{gauges.get('limit', 0)}"
    text += f" throttled {gauges.get('throttled', 0)}"
    if gauges.get("waiting"):
        text += f" queued {gauges['waiting']}"
    return text


class LiveCounts:
    """Episodes finished so far per stop reason: received by the driver, plus finished on a
    worker and not yet returned (each worker's own running count, polled by the driver).

    A worker is a key (its slot and generation); a replaced worker's unreturned episodes are
    run again elsewhere, so only the keys passed to `counts` as alive contribute theirs.
    """

    def __init__(self) -> None:
        self.received: Counter[str] = Counter()
        self._returned: dict[Hashable, Counter[str]] = {}
        self._reported: dict[Hashable, Counter[str]] = {}
        self._gauges: dict[Hashable, dict[str, int]] = {}

    def returned(self, worker: Hashable, reasons: Iterable[str]) -> None:
        """A batch came back from `worker` with episodes of these stop reasons."""
        self._returned.setdefault(worker, Counter()).update(reasons)

    def keep(self, reason: str) -> None:
        """The driver kept an episode for commit (not a duplicate, not a fatal rejection)."""
        self.received[reason] += 1

    def reported(self, worker: Hashable, finished: Mapping[str, int]) -> None:
        """`worker` said it has finished this many episodes per stop reason, ever."""
        reasons = {k: v for k, v in finished.items() if not k.startswith(ADMISSION_PREFIX)}
        self._reported[worker] = Counter(reasons)
        self._gauges[worker] = {k[len(ADMISSION_PREFIX):]: v for k, v in finished.items()
                                if k.startswith(ADMISSION_PREFIX)}

    def counts(self, alive: Iterable[Hashable]) -> Tally:
        """Finished episodes per stop reason. A poll answer older than a returned batch makes
        the difference negative; Counter subtraction floors it at zero (never counts twice).
        The live workers' admission gauges, summed, ride along (`Tally.gauges`)."""
        total = Counter(self.received)
        gauges: Counter[str] = Counter()
        for worker in alive:
            total.update(self._reported.get(worker, Counter()) - self._returned.get(worker, Counter()))
            gauges.update(self._gauges.get(worker, {}))
        return Tally(total, gauges)


class Progress:
    """Renders job progress; `update` is cheap to call often (it throttles itself)."""

    def __init__(
        self,
        total: int,
        *,
        already: int = 0,
        stream: TextIO | None = None,
        live: bool | None = None,
        log_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.already = already
        """Episodes committed by an earlier run of the same config (resume)."""
        self._stream = stream if stream is not None else sys.stderr
        self._live = self._stream.isatty() if live is None else live
        self._interval = 0.2 if self._live else log_interval_s
        self._clock = clock
        self._start = clock()
        self._last = float("-inf")
        self._width = 0

    def line(
        self, committed: int, counts: Mapping[str, int], note: str = "", finished: int | None = None
    ) -> str:
        """The progress text for `finished` new episodes this run, `committed` of them
        committed (`finished` omitted: the committed ones are all that is known)."""
        new = committed if finished is None else max(finished, committed)
        done = self.already + new
        frac = done / self.total if self.total else 1.0
        bar = "#" * int(frac * 20)
        elapsed = self._clock() - self._start
        rate = new / elapsed if elapsed > 0 else 0.0
        remaining = self.total - done
        eta = f" eta {_duration(remaining / rate)}" if rate > 0 and remaining > 0 else ""
        head = f"[{bar:<20}] {done}/{self.total} {frac:4.0%}"
        if finished is not None:
            head += f" ({self.already + committed} committed)"
        parts = [head, f"{rate:.1f} ep/s{eta}"]
        if counts:
            parts.append(format_counts(counts))
        admission = format_admission(getattr(counts, "gauges", {}))
        if admission:
            parts.append(admission)
        if note:
            parts.append(note)
        return " | ".join(parts)

    def due(self) -> bool:
        """Whether `update` would draw a line now: the driver asks its workers for their counts
        only then (a Ray call per worker), not on every pass of its loop."""
        return self._clock() - self._last >= self._interval

    def update(
        self,
        committed: int,
        counts: Mapping[str, int],
        note: str = "",
        force: bool = False,
        finished: int | None = None,
    ) -> None:
        """Show progress if enough time has passed since the last line (or `force`)."""
        now = self._clock()
        if not force and now - self._last < self._interval:
            return
        self._last = now
        text = self.line(committed, counts, note, finished)
        if self._live:
            pad = max(0, self._width - len(text))
            self._stream.write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def close(
        self, committed: int, counts: Mapping[str, int], note: str = "", finished: int | None = None
    ) -> None:
        """The final line, always shown, ending the in-place line on a terminal."""
        self.update(committed, counts, note, force=True, finished=finished)
        if self._live:
            self._stream.write("\n")
            self._stream.flush()
