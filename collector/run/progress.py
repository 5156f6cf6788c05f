"""A progress line for `collector run`: episodes committed, rate, and live counts per stop reason.

Plain text on stderr, no dependency: on a terminal one line is rewritten in place (at most a
few times a second); when stderr is a file or a pipe (CI logs, `tee`, a test reading it) a
full line is printed every `log_interval_s`, so logs stay readable and grep-able. The counts
per stop reason are the point: a sweep whose `length` count climbs is visible long before
the table at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
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

    def line(self, committed: int, counts: Mapping[str, int], note: str = "") -> str:
        """The progress text for `committed` new episodes this run."""
        done = self.already + committed
        frac = done / self.total if self.total else 1.0
        bar = "#" * int(frac * 20)
        elapsed = self._clock() - self._start
        rate = committed / elapsed if elapsed > 0 else 0.0
        remaining = self.total - done
        eta = f" eta {_duration(remaining / rate)}" if rate > 0 and remaining > 0 else ""
        parts = [f"[{bar:<20}] {done}/{self.total} {frac:4.0%}", f"{rate:.1f} ep/s{eta}"]
        if counts:
            parts.append(format_counts(counts))
        if note:
            parts.append(note)
        return " | ".join(parts)

    def update(self, committed: int, counts: Mapping[str, int], note: str = "", force: bool = False) -> None:
        """Show progress if enough time has passed since the last line (or `force`)."""
        now = self._clock()
        if not force and now - self._last < self._interval:
            return
        self._last = now
        text = self.line(committed, counts, note)
        if self._live:
            pad = max(0, self._width - len(text))
            self._stream.write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def close(self, committed: int, counts: Mapping[str, int], note: str = "") -> None:
        """The final line, always shown, ending the in-place line on a terminal."""
        self.update(committed, counts, note, force=True)
        if self._live:
            self._stream.write("\n")
            self._stream.flush()
