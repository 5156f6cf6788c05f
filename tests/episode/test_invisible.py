"""Invisible turns: output tokens spent with nothing to show are never a final answer.

The `sim-swallow` preset plays llama-server when its tool-call parser gives up on a call
turn: unstreamed, the Hermes block stays in `content`; streamed, the markup it held back is
dropped, leaving finish `stop`, some output tokens, no text and no call. Both modes of the
same generation must end the same way, and neither as `done`.
"""

from __future__ import annotations

import httpx
import pytest

from collector.config import LoopConfig
from collector.envs.arithmetic import ArithmeticEnv
from collector.episode.loop import EpisodeSpec, run_episode
from collector.episode.notices import INVISIBLE_NOTICE
from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint
from collector.providers.scripted import text
from collector.sim.app import create_app
from collector.stop import StopReason
from tests.episode.helpers import run


async def _episodes(stream: bool, **loop: object) -> list[tuple[str, StopReason, list[bool]]]:
    env = ArithmeticEnv(num_tasks=6)
    transport = httpx.ASGITransport(app=create_app(seed=0))
    out = []
    async with httpx.AsyncClient(transport=transport) as client:
        endpoint = Endpoint(base_url_for("chat", "http://sim.test"), streaming=stream)
        provider = build_provider("chat", endpoint, client)
        for task in env.tasks():
            spec = EpisodeSpec("inv", "sim-swallow", "chat", 256, task, seed=3, env_name=env.name)
            ep = await run_episode(spec, provider, env, LoopConfig.model_validate(loop))
            out.append((task.id, ep.stop_reason, [t.invisible_output for t in ep.turns]))
    return out


async def test_swallowed_stream_and_its_unstreamed_twin_end_alike() -> None:
    """Streamed and unstreamed, one generation gets one stop reason; the swallowed stream is never done."""
    plain = await _episodes(stream=False)
    streamed = await _episodes(stream=True)
    assert [(i, r) for i, r, _ in streamed] == [(i, r) for i, r, _ in plain]
    assert {r for _, r, _ in streamed} == {StopReason.MALFORMED_TOOL_CALL}
    assert all(flags == [True] for _, _, flags in streamed)  # the signal is recorded on the turn
    assert all(flags == [False] for _, _, flags in plain)  # unstreamed, the block was visible


async def test_invisible_turn_gets_a_notice_when_malformed_is_not_fatal() -> None:
    """With malformed_tool_call out of stop_on an invisible turn gets a notice, never taken as done."""
    empty = text("")
    empty.usage.output_tokens = 13
    ep, provider, _ = await run([empty, text("done")], stop_on=["length"])
    assert ep.stop_reason is StopReason.DONE
    assert ep.turns[0].invisible_output
    assert provider.requests[1].messages[-1].text == INVISIBLE_NOTICE  # type: ignore[union-attr]


@pytest.mark.parametrize("field", ["reasoning", "refusal", "no_tokens"])
async def test_empty_answer_with_something_behind_it_stays_an_answer(field: str) -> None:
    """An empty answer that spent no tokens, or spent them on reasoning or a refusal, is not invisible."""
    empty = text("")
    empty.usage.output_tokens = 0 if field == "no_tokens" else 13
    if field == "reasoning":
        empty.reasoning = True
    if field == "refusal":
        empty.refusal = "I cannot help with that."
    ep, _, _ = await run([empty])
    assert ep.stop_reason is StopReason.DONE
    assert not ep.turns[0].invisible_output

