"""Each harness session's redactor: the episode's token scrubbed from its record, nothing kept after it."""

from __future__ import annotations

import asyncio

import httpx

from collector.config import LoopConfig
from collector.episode import state
from collector.episode.loop import EpisodeSpec, record_episode
from collector.harness.request import HarnessRequest
from collector.harness.session import HarnessSession
from collector.providers import build_provider
from collector.providers.base import Endpoint
from collector.sim.app import create_app
from collector.stop import StopReason
from collector.turn import UserMessage
from tests.harness.helpers import TASKS


def _spec(i: int) -> EpisodeSpec:
    return EpisodeSpec(run_id="r", model="sim-perfect", provider_kind="sim", budget=400, task=TASKS[0],
                       seed=i)


def test_opening_sessions_keeps_no_redactor_per_episode_in_the_worker() -> None:
    """A worker serving many harness episodes keeps no redactor per episode token for its whole life."""
    before = len(state._REDACTORS)
    sessions = [HarnessSession(_spec(i), None, LoopConfig()) for i in range(50)]  # type: ignore[arg-type]
    assert len({s.token for s in sessions}) == 50
    assert len(state._REDACTORS) - before <= 1


def test_a_token_the_harness_echoes_never_reaches_the_record() -> None:
    """A harness that writes its episode token into a message gets a record with the token scrubbed."""

    async def run() -> tuple[str, str]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(0))) as sim:
            provider = build_provider("chat", Endpoint("http://sim/v1"), sim)
            session = HarnessSession(_spec(0), provider, LoopConfig())
            echoed = f"{TASKS[0].prompt} (my key is {session.token})"
            await session.complete(HarnessRequest([UserMessage(echoed)], [], None, False, "m"))
            session.end(StopReason.DONE)
            session.finish()
            episode = record_episode(session.spec, "harness", session.state, StopReason.DONE, (1.0, 1.0),
                                     None, session.offered, 0.0)
            return session.token, repr(episode)

    token, record = asyncio.run(run())
    assert "my key is" in record
    assert token not in record
