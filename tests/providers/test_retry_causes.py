"""Every retried request is counted with its cause, on the turn that came back or on the error
that escaped, and the episode record keeps both (a rate measured through a storm says so)."""

from __future__ import annotations

import httpx
import pytest

from collector.config import LoopConfig
from collector.episode.loop import EpisodeSpec, run_episode
from collector.errors import ProtocolViolation, ProviderUnavailable
from collector.stop import StopReason
from tests.episode.helpers import ToyEnv
from tests.providers.conftest import MakeProvider, request
from tests.providers.test_errors_retries import err, good


async def test_a_turn_carries_the_cause_of_each_retry(make: MakeProvider) -> None:
    """429, 5xx, a timeout and a refused connection before the reply are recorded in that order."""
    replies = [err(429, "chat_error_429_tpm.json", {"retry-after": "0"}), err(503), httpx.ReadTimeout("slow"),
               httpx.ConnectError("refused"), good("chat")]
    provider, _, _ = await make("chat", *replies, retries=5)
    turn = await provider.complete(request())
    assert turn.retries == ("429", "5xx", "timeout", "dropped")
    provider, _, _ = await make("chat", good("chat"))
    assert (await provider.complete(request())).retries == ()


async def test_a_dropped_stream_is_counted_as_dropped(make: MakeProvider) -> None:
    """A stream that ends before its terminal event and is asked for again counts as `dropped`."""
    whole = good("chat", stream=True)
    provider, _, _ = await make("chat", whole[: whole.rfind(b"data:")], whole, stream=True)
    assert (await provider.complete(request())).retries == ("dropped",)


async def test_the_error_that_escapes_carries_its_retries(make: MakeProvider) -> None:
    """A call that fails after its retries says which retries it spent; a bad 200 body is `other`."""
    provider, _, _ = await make("chat", err(500), err(500), err(500), err(500), retries=3)
    with pytest.raises(ProviderUnavailable) as info:
        await provider.complete(request())
    assert info.value.retries == ("5xx", "5xx", "5xx")
    provider, _, _ = await make("chat", b"{}", b"{}", retries=1)
    with pytest.raises(ProtocolViolation) as bad:
        await provider.complete(request())
    assert bad.value.retries == ("other",)


async def test_the_episode_keeps_retries_of_its_turns_and_of_its_failed_call(make: MakeProvider) -> None:
    """Per turn in `turns.retries`; per episode in `retries`, the failed last call's included."""
    replies = [err(429, "chat_error_429_tpm.json", {"retry-after": "0"}), good("chat"),
               err(502), err(502), err(502)]
    provider, _, _ = await make("chat", *replies, retries=2)
    env = ToyEnv()
    spec = EpisodeSpec("run", "model", "chat", 64, env.tasks()[0], env_name=env.name)
    episode = await run_episode(spec, provider, env, LoopConfig())
    assert episode.stop_reason is StopReason.ERROR
    assert [t.retries for t in episode.turns] == [["429"]]
    assert episode.retries == ["429", "5xx", "5xx"]
