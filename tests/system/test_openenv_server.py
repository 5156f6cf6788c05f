"""`openenv` with `server`: the collector starts the OpenEnv server command itself, per worker
or per episode (a server process, so this is a system-tier test)."""

from __future__ import annotations

import asyncio

from collector.config import LoopConfig
from collector.envs import openenv_server
from collector.envs.loading import load_environment
from collector.envs.openenv import OpenEnvEnvironment, OpenEnvWorld
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers.scripted import ScriptedProvider, call, calls
from collector.record.episode import Episode
from collector.stop import StopReason

COMMAND = ["python", "-m", "tests.envs.openenv_servers", "{port}"]


async def _episode(env: OpenEnvEnvironment, worlds: list[OpenEnvWorld]) -> Episode:
    start = env.start

    def remembering(task: object, context: object = None) -> OpenEnvWorld:
        world = start(task, context)  # type: ignore[arg-type]
        worlds.append(world)
        return world

    env.start = remembering  # type: ignore[method-assign]
    script = [calls(call("act", {"guess": 1}))]
    spec = EpisodeSpec("run", "model", "scripted", 64, env.tasks()[0], env_name=env.name)
    return await run_episode(spec, ScriptedProvider(script), env, LoopConfig())


async def test_a_server_per_episode_is_started_for_each_and_stopped_after() -> None:
    """With `server_scope = "episode"` every episode starts its own server (a fresh port) and
    stops it when the episode ends."""
    env = load_environment("openenv", {"server": COMMAND, "server_scope": "episode", "reward": "final"})
    assert isinstance(env, OpenEnvEnvironment)
    worlds: list[OpenEnvWorld] = []
    first = await _episode(env, worlds)
    second = await _episode(env, worlds)
    assert first.stop_reason is StopReason.DONE, first.error
    assert (first.reward, second.reward) == (1.0, 1.0)
    servers = [w._server for w in worlds]
    assert all(s is not None and not s.running for s in servers)
    assert servers[0] is not servers[1]


async def test_a_server_per_worker_is_started_once_and_shared() -> None:
    """With the default `server_scope = "worker"` the first episode starts the server and the
    next one reuses it (same URL, still running)."""
    env = load_environment("openenv", {"server": COMMAND, "reward": "final"})
    assert isinstance(env, OpenEnvEnvironment)
    worlds: list[OpenEnvWorld] = []
    try:
        first = await _episode(env, worlds)
        server = env._worker_server
        assert server is not None
        url = server.url
        second = await _episode(env, worlds)
        assert (first.reward, second.reward) == (1.0, 1.0)
        assert server.running
        assert env._worker_server is server
        assert server.url == url
    finally:
        if env._worker_server is not None:
            await env._worker_server.stop()


async def test_a_server_command_that_dies_is_an_error_episode_quoting_it() -> None:
    """A command that exits before serving ends the episode as `error` quoting its last line."""
    env = load_environment("openenv", {"server": ["python", "-c", "raise SystemExit('no such env')"],
                                       "server_scope": "episode"})
    assert isinstance(env, OpenEnvEnvironment)
    episode = await _episode(env, [])
    assert episode.stop_reason is StopReason.ERROR
    assert episode.error is not None
    assert "exited with code 1 before serving; its last words: no such env" in episode.error.message


async def test_episodes_opening_at_once_start_one_worker_server() -> None:
    """A worker's first episodes open together: one of them starts the server and the others wait
    for it, so exactly one server process runs for the worker (none started and then left to run
    unused until the worker exits), and every episode plays on it."""
    env = load_environment("openenv", {"server": COMMAND, "reward": "final"})
    assert isinstance(env, OpenEnvEnvironment)
    before = set(openenv_server._RUNNING)
    try:
        episodes = await asyncio.gather(*(_episode(env, []) for _ in range(4)))
        assert [e.stop_reason for e in episodes] == [StopReason.DONE] * 4, [e.error for e in episodes]
        assert [e.reward for e in episodes] == [1.0] * 4
        assert len(openenv_server._RUNNING - before) == 1
    finally:
        if env._worker_server is not None:
            await env._worker_server.stop()
        for stray in openenv_server._RUNNING - before:
            stray.kill()
