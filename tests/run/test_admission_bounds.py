"""The adaptive gate under hostile admission headers: a date `datetime` cannot hold never jams
it, and a pause over `MAX_PAUSE_S` is not applied (collector.run.admission)."""

from __future__ import annotations

import asyncio
import email.utils
from datetime import UTC, datetime

import httpx
import pytest

from collector.run.admission import MAX_PAUSE_S, Admission, AdmissionTransport, header_pause_s

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


@pytest.mark.parametrize("value", ["1e9", "inf", "nan", YEAR_9999_HTTP])
def test_a_retry_after_over_the_bound_pauses_nothing(value: str) -> None:
    """Retry-After 1e9, inf, nan or a year-9999 date is not applied to the gate at all (not cut
    to MAX_PAUSE_S): the other requests to the pair are not held."""
    transport = _replies(_reply(429, {"retry-after": value}), _reply(200, {}))
    assert asyncio.run(_post_twice(transport)) == [429, 200]
    assert transport.admission.controller.pause_left() == 0.0


def test_a_reset_over_the_bound_pauses_nothing_and_one_under_it_pauses() -> None:
    """A rate-limit reset in year 9999 holds nothing; a reset of 30 s still holds the gate."""
    far = {"anthropic-ratelimit-requests-remaining": "0",
           "anthropic-ratelimit-requests-reset": YEAR_9999_RFC3339}
    assert header_pause_s(far, 1) > MAX_PAUSE_S
    gate = Admission(1)
    gate.controller.pause(header_pause_s(far, 1))
    assert gate.controller.pause_left() == 0.0
    gate.controller.pause(30.0)
    assert 29 < gate.controller.pause_left() <= 30
