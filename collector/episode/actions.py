"""Text actions: a turn's text sent to a text-action world's `step` (check order, step 6).

Tests: tests/envs/test_textaction.py

`take_action` is called only for a turn that passed the length and argument checks, so a
cut or malformed turn never reaches the environment (`collector.envs.textaction`). The step
is bounded by `loop.tool_timeout_s` like a tool call; what the environment raises, or a
result it cannot use, ends the episode as `error` naming the cause.
"""

from __future__ import annotations

import asyncio

from collector.envs.textaction import TextActionWorld
from collector.episode.state import EpisodeState, env_failure

__all__ = ["take_action"]


async def take_action(world: TextActionWorld, text: str, state: EpisodeState) -> bool:
    """Send `text` to the world as one action; True when the episode is over (`done`).

    When it is not, the observation is appended as the next user message.
    """
    try:
        async with asyncio.timeout(state.settings.tool_timeout_s):
            result = await world.act(text)
    # Broad on purpose: whatever the environment raises (its timeout included) is its
    # failure, an `error` episode, never a reward of 0 that reads as the model's.
    except Exception as exc:
        raise env_failure("step", exc, state.redactor) from exc
    if result.done:
        return True
    state.notice(result.observation)
    return False
