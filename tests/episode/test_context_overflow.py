"""`context_overflow` is a stop reason, not an error: from each provider's context-length error
and, with `provider.context_window` set, before a doomed request."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from collector.cli import main
from collector.config import LoopConfig
from collector.envs.support_desk import SupportDeskEnv
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint
from collector.record.episode import Episode
from collector.sim.app import create_app
from collector.sim.presets import PRESETS
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from collector.turn import Turn, TurnRequest
from tests.episode.test_sim_e2e import APPROVAL
from tests.record.factory import make_episode

KINDS = ["chat", "responses", "anthropic", "gemini"]
_PRESETS = {
    **PRESETS,
    "sim-tiny-context": dataclasses.replace(
        PRESETS["sim-perfect"], name="sim-tiny-context", context_window=50
    ),
}


class Counting:
    """A real adapter that keeps every request it was asked to send."""

    def __init__(self, kind: str, client: httpx.AsyncClient, stream: bool = False) -> None:
        async def no_sleep(seconds: float) -> None:
            return None

        endpoint = Endpoint(base_url_for(kind, "http://sim.test"), streaming=stream)
        self.inner = build_provider(kind, endpoint, client, sleep=no_sleep)
        self.kind = kind
        self.requests: list[TurnRequest] = []

    async def complete(self, request: TurnRequest) -> Turn:
        self.requests.append(request)
        return await self.inner.complete(request)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(seed=0, presets=_PRESETS))
    async with httpx.AsyncClient(transport=transport) as c:
        yield c


async def _run(provider: Counting, model: str, budget: int, window: int | None = None) -> Episode:
    env = SupportDeskEnv(num_tasks=10)
    spec = EpisodeSpec(
        "ctx", model, provider.kind, budget, APPROVAL, env_name=env.name, context_window=window
    )
    return await run_episode(spec, provider, env, LoopConfig.model_validate({}))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("kind", KINDS)
async def test_the_providers_context_error_ends_the_episode_as_context_overflow(
    client: httpx.AsyncClient, kind: str, stream: bool
) -> None:
    """Each dialect's context-length error (from the simulator, in that dialect's words) ends the
    episode as a trainable `context_overflow` with reward 0, not as an untrainable `error`."""
    episode = await _run(Counting(kind, client, stream), "sim-tiny-context", 256)
    assert episode.stop_reason is StopReason.CONTEXT_OVERFLOW, episode.error
    assert episode.trainable
    assert episode.reward == 0.0
    assert episode.error is None


async def test_a_turn_that_cannot_fit_sends_no_request(client: httpx.AsyncClient) -> None:
    """With `provider.context_window` smaller than the prompt, the episode ends as
    `context_overflow` before any request is sent."""
    provider = Counting("chat", client)
    episode = await _run(provider, "sim-perfect", 256, window=20)
    assert episode.stop_reason is StopReason.CONTEXT_OVERFLOW
    assert provider.requests == []


async def test_the_cap_is_clamped_to_what_the_window_leaves(client: httpx.AsyncClient) -> None:
    """A window a little larger than the prompt clamps each turn's cap to what it leaves, and the
    turn record keeps the clamped cap; the episode ends once the next turn cannot fit."""
    probe = Counting("chat", client)
    await _run(probe, "sim-perfect", 4096, window=2000)
    prompt = 2000 - probe.requests[0].max_output_tokens  # what the loop counts for the prompt
    assert 0 < prompt < 2000
    window = prompt + 40  # leaves 40 tokens for the first turn
    provider = Counting("chat", client)
    episode = await _run(provider, "sim-perfect", 4096, window=window)
    assert provider.requests[0].max_output_tokens == 40
    assert episode.turns[0].max_output_tokens == 40
    assert all(r.max_output_tokens <= 40 for r in provider.requests)
    assert episode.stop_reason is StopReason.CONTEXT_OVERFLOW
    assert len(provider.requests) == len(episode.turns)  # the doomed turn was never sent


def test_stats_give_context_overflow_its_own_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`collector stats` shows a context_overflow column (table) and rate (json) when it occurs."""
    eps = [make_episode(StopReason.DONE, model="m", budget=64, task=f"t{i}") for i in range(3)]
    eps.append(make_episode(StopReason.CONTEXT_OVERFLOW, model="m", budget=64, task="long"))
    with LocalRunStore.open(tmp_path / "run", "fp", {}, "arrow", 64) as st:
        st.commit(eps)
    assert main(["stats", str(tmp_path / "run")]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "context_overflow" in header
    assert main(["stats", str(tmp_path / "run"), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows[0]["context_overflow_rate"] == 0.25


def test_stats_count_thinking_cuts_beside_truncation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Episodes with a turn whose cap went to thinking are counted as `thinking_cut_rate` and
    shown as a "thinking cut" column, inside the truncation rate."""
    eps = [make_episode(StopReason.LENGTH, model="m", budget=64, task=f"t{i}") for i in range(4)]
    eps[0].turns[-1].length_signals = ["finish_reason", "cap_reached", "reasoning"]
    with LocalRunStore.open(tmp_path / "run", "fp", {}, "arrow", 64) as st:
        st.commit(eps)
    assert main(["stats", str(tmp_path / "run")]) == 0
    assert "thinking cut" in capsys.readouterr().out.splitlines()[0]
    assert main(["stats", str(tmp_path / "run"), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows[0]["thinking_cut_rate"] == 0.25
    assert rows[0]["truncation_rate"] == 1.0
