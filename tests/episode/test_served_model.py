"""The model that answered is recorded on every turn, whatever the wire and mode."""

from __future__ import annotations

import httpx
import pytest

from collector.config import LoopConfig
from collector.envs.arithmetic import ArithmeticEnv
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint
from collector.sim.app import create_app


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", ["chat", "responses", "anthropic", "gemini"])
async def test_every_turn_records_the_model_that_answered(kind: str, stream: bool) -> None:
    """On all four wires, streamed or not, each turn keeps the reply's model (chat: its fingerprint too)."""
    env = ArithmeticEnv(num_tasks=1)
    transport = httpx.ASGITransport(app=create_app(seed=0))
    async with httpx.AsyncClient(transport=transport) as client:
        endpoint = Endpoint(base_url_for(kind, "http://sim.test"), streaming=stream)
        provider = build_provider(kind, endpoint, client)
        spec = EpisodeSpec("m", "sim-perfect", kind, 256, env.tasks()[0], env_name=env.name)
        ep = await run_episode(spec, provider, env, LoopConfig())
    assert ep.turns
    assert {t.response_model for t in ep.turns} == {"sim-perfect"}
    fingerprints = {t.system_fingerprint for t in ep.turns}
    assert fingerprints == ({"fp_sim"} if kind == "chat" else {None})
