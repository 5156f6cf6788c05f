"""A server's requested wait, as seconds from now: `retry-after-ms`, `retry-after` and reset times.

Shared by the retry loop (`collector.providers.http.parse_retry_after`: how long to sleep
before the retry) and the adaptive gate (`collector.run.admission`: how long to hold every
request to the pair). Header values are whatever a server (or a proxy in front of it) wrote,
so nothing here raises: a date past what `datetime` holds (`Fri, 31 Dec 99999999999999999999
23:59:59 GMT`), a malformed one, or a number that is not one is "no wait given" (None), and
the caller falls back to its own back-off. Huge values are returned as they are (1e9 s, a
year-9999 date, `inf`): each caller applies its own bound to what it is asked to wait
(`RetryPolicy.max_retry_after_s`, `collector.run.admission.MAX_PAUSE_S`).

Tests: tests/providers/test_retry_after_bounds.py, tests/run/test_admission_bounds.py.
"""

from __future__ import annotations

import email.utils
import math
from collections.abc import Mapping
from datetime import UTC, datetime

__all__ = ["header_retry_after_s", "seconds_until"]

# What parsing a hostile date can raise: OverflowError for fields past a C long (a year of
# twenty digits), ValueError for one out of datetime's range, the others for torn strings.
_BAD_DATE = (TypeError, ValueError, IndexError, OverflowError)


def seconds_until(value: str) -> float | None:
    """Seconds from now until `value`, an RFC 3339 time or an HTTP date (0 when past), or None
    when it is neither, or is a date `datetime` cannot hold."""
    value = value.strip()
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except _BAD_DATE:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except _BAD_DATE:
            return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return max(0.0, (when - datetime.now(UTC)).total_seconds())
    except _BAD_DATE:  # an offset that takes the date past year 1 or 9999 in UTC
        return None


def header_retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The wait a reply's `retry-after-ms` or `retry-after` (seconds or an HTTP date) asks
    for, or None when it gives none that can be read (NaN included)."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if not value:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            if name == "retry-after":
                return seconds_until(value)
            continue
        if not math.isnan(seconds):
            return max(0.0, seconds)
    return None
