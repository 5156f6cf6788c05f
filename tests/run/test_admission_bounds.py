"""The adaptive gate under hostile admission headers: a date `datetime` cannot hold never jams
it (collector.run.admission)."""

from __future__ import annotations

import asyncio
import email.utils
from datetime import UTC, datetime

import httpx
import pytest

from collector.run.admission import Admission, AdmissionTransport

OVERFLOWING = "Fri, 31 Dec 99999999999999999999 23:59:59 GMT"
YEAR_9999_HTTP = email.utils.format_datetime(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC), usegmt=True)
YEAR_9999_RFC3339 = "9999-12-31T23:59:59Z"


def _replies(*responses: httpx.Response) -> AdmissionTransport:
    replies = iter(responses)
    return AdmissionTransport(httpx.MockTransport(lambda request: next(replies)), Admission(1))


def _reply(status: int, headers: dict[str, str]) -> httpx.Response:
    # Streamed, as a real transport gives it: the gate releases the slot when the body closes.
    return httpx.Response(status, headers=headers, stream=httpx.ByteStream(b"{}"))


async def _post_twice(transport: AdmissionTransport) -> list[int]:
    async with httpx.AsyncClient(transport=transport) as client:
        first = await client.post("http://sim/v1/chat/completions", content=b"{}")
        gate = transport.admission.controller
        assert gate.in_flight == 0  # the slot came back with the reply
        assert gate.has_room()
        # A ceiling of 1: this second request is admitted only if the first's slot was released.
        second = await asyncio.wait_for(client.post("http://sim/v1/chat/completions", content=b"{}"), 30)
        return [first.status_code, second.status_code]


@pytest.mark.parametrize("headers", [
    {"retry-after": OVERFLOWING},
    {"retry-after": "Fri, 31 Dec 2026 23:59:59 +99999999999999999999"},
])
def test_an_overflowing_retry_after_date_releases_the_slot(headers: dict[str, str]) -> None:
    """A 429 whose Retry-After date overflows datetime gives its slot back and pauses nothing:
    the next request is admitted at once."""
    transport = _replies(_reply(429, headers), _reply(200, {}))
    assert asyncio.run(_post_twice(transport)) == [429, 200]
    assert transport.admission.controller.pause_left() == 0.0
    assert transport.admission.controller.in_flight == 0


@pytest.mark.parametrize("headers", [
    {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": OVERFLOWING},
    {"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": OVERFLOWING},
])
def test_an_overflowing_reset_date_releases_the_slot(headers: dict[str, str]) -> None:
    """A healthy reply whose rate-limit reset date overflows datetime releases its slot and
    pauses nothing."""
    transport = _replies(_reply(200, headers), _reply(200, {}))
    assert asyncio.run(_post_twice(transport)) == [200, 200]
    assert transport.admission.controller.pause_left() == 0.0
