"""Episodes of an environment on the simulator, in process, and the `collector stats` table of them:
what the guarantee and conformance tests compare across forms of one environment."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest

from collector.cli import main
from collector.config import LoopConfig
from collector.envs.base import Environment
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint
from collector.record.episode import Episode
from collector.sim.app import create_app
from collector.storage.local import LocalRunStore

SIM_SEED = 5


async def collect_on_sim(env: Environment, cells: Sequence[tuple[str, int]], samples: int) -> list[Episode]:
    """Every task of `env`, `samples` times in each (model, budget) cell, one after another, on
    the simulator app (seed `SIM_SEED`) over the Chat Completions wire."""
    episodes = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(seed=SIM_SEED))) as client:
        endpoint = Endpoint(base_url_for("chat", "http://sim.test"), api_key="sk-sim")
        provider = build_provider("chat", endpoint, client)
        for model, budget in cells:
            for task in env.tasks():
                for sample in range(samples):
                    spec = EpisodeSpec("sim-run", model, "chat", budget, task, sample=sample, seed=sample)
                    episodes.append(await run_episode(spec, provider, env, LoopConfig()))
    return episodes


def stats_table(episodes: list[Episode], path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """What `collector stats` prints for `episodes` committed as one run at `path`."""
    with LocalRunStore.open(path, "fp-sim-run", {"name": "sim-run"}, "arrow", 64) as store:
        store.commit(episodes)
    capsys.readouterr()
    assert main(["stats", str(path)]) == 0
    return capsys.readouterr().out


def assert_only_whole_turns_ran(episodes: list[Episode]) -> None:
    """Every call the loop executed came from a turn that was neither cut nor malformed."""
    for e in episodes:
        for c in e.executed_tool_calls:
            turn = e.turns[c.turn_index]
            assert not turn.discarded
            assert turn.finish_class != "length"
            assert turn.malformed_calls == 0
