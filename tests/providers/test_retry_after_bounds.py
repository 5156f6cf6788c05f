"""A server's Retry-After that `datetime` cannot hold, or that asks for years, neither breaks
nor stalls the retry loop (static admission: no gate in front of the provider)."""

from __future__ import annotations

import email.utils
from datetime import UTC, datetime

import pytest

from collector.errors import ProviderUnavailable
from collector.providers.http import parse_retry_after
from collector.providers.retryafter import seconds_until
from collector.turn import FinishClass
from tests.providers.conftest import MakeProvider, request
from tests.providers.test_errors_retries import err, good

#: Dates whose fields overflow a C long or int, or datetime's years, in every header form.
OVERFLOWING = (
    "Fri, 31 Dec 99999999999999999999 23:59:59 GMT",
    "Fri, 99999999999999999999 Dec 2026 23:59:59 GMT",
    "Fri, 31 Dec 2026 23:59:59 +99999999999999999999",
    "Mon, 01 Jan 99999 00:00:00 GMT",
)
YEAR_9999 = email.utils.format_datetime(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC), usegmt=True)


@pytest.mark.parametrize("value", OVERFLOWING)
def test_an_overflowing_retry_after_date_is_no_wait_given(value: str) -> None:
    """A Retry-After date past what datetime holds reads as "no wait given" (None), never raises."""
    assert parse_retry_after({"retry-after": value}) is None
    assert seconds_until(value) is None


@pytest.mark.parametrize("kind", ["chat", "anthropic"])
@pytest.mark.parametrize("value", OVERFLOWING)
async def test_a_429_with_an_overflowing_date_is_retried_not_an_error(
    make: MakeProvider, kind: str, value: str
) -> None:
    """Under static admission a 429 whose Retry-After date overflows is retried after the
    policy's own back-off, and the turn returns."""
    file = "chat_error_429_tpm.json" if kind == "chat" else "anthropic_error_429.json"
    provider, recorder, sleeps = await make(kind, err(429, file, {"retry-after": value}), good(kind))
    turn = await provider.complete(request())
    assert turn.finish_class is FinishClass.TOOL_CALLS
    assert len(recorder.requests) == 2
    assert len(sleeps.waits) == 1
    assert sleeps.waits[0] <= 120


@pytest.mark.parametrize("value", ["1e9", "inf", YEAR_9999])
async def test_a_retry_after_of_years_fails_at_once(make: MakeProvider, value: str) -> None:
    """Retry-After 1e9, inf or a year-9999 date is over max_retry_after_s: the request fails at
    once as unavailable, with no sleep at all (not a 120 s one)."""
    reply = err(429, "chat_error_429_tpm.json", {"retry-after": value})
    provider, recorder, sleeps = await make("chat", reply)
    with pytest.raises(ProviderUnavailable, match="over the limit"):
        await provider.complete(request())
    assert len(recorder.requests) == 1
    assert sleeps.waits == []


def test_a_nan_retry_after_is_no_wait_given() -> None:
    """`Retry-After: nan` is not a number of seconds: the policy's back-off applies."""
    assert parse_retry_after({"retry-after": "nan"}) is None
    assert parse_retry_after({"retry-after-ms": "nan", "retry-after": "3"}) == 3.0


