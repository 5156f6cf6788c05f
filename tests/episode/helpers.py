"""Shared checks and a toy environment for the loop tests (fakes, not mocks)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from collector.config import LoopConfig
from collector.envs.base import Environment, EpisodeWorld, Task, Tool
from collector.envs.toolkit import tool
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers.scripted import ScriptedProvider, Step
from collector.record.episode import Episode
from collector.stop import StopReason


def assert_settled(episode: Episode) -> None:
    """Every call id of every assistant message has exactly one result, right after its turn."""
    messages = episode.messages
    for i, message in enumerate(messages):
        if message.role != "assistant" or not message.tool_calls:
            continue
        ids = [c.id for c in message.tool_calls]
        results = []
        for follower in messages[i + 1 :]:
            if follower.role != "tool":
                break
            results.append(follower.call_id)
        assert results == ids, (ids, results)
    counts = Counter(m.call_id for m in messages if m.role == "tool")
    assert all(n == 1 for n in counts.values()), counts


class ToyWorld(EpisodeWorld):
    """Records every call that actually runs; `approve` is a gate."""

    def __init__(self, log: list[tuple[str, dict[str, object]]], approve_ok: bool = True) -> None:
        self.log = log
        self.approve_ok = approve_ok
        self._tools: tuple[Tool, ...] = (
            tool(self.refund, inline=True),
            tool(self.close_tickets, inline=True),
            tool(self.approve, inline=True, gate=True),
            tool(self.slow, timeout_s=0.05),
            tool(self.boom, inline=True),
        )

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    def refund(self, order_id: str, amount: float) -> str:
        """Refund an amount on an order."""
        self.log.append(("refund", {"order_id": order_id, "amount": amount}))
        return "ok"

    def close_tickets(self, customer_id: str = "", older_than_days: int = 0) -> str:
        """Close tickets (all-optional filters)."""
        self.log.append(("close_tickets", {"customer_id": customer_id, "older_than_days": older_than_days}))
        return "closed"

    def approve(self, order_id: str) -> str:
        """Ask for approval."""
        self.log.append(("approve", {"order_id": order_id}))
        if not self.approve_ok:
            raise PermissionError("denied")
        return "approved"

    async def slow(self) -> str:
        """Hangs."""
        self.log.append(("slow", {}))
        await asyncio.sleep(3600)
        return "never"

    def boom(self) -> str:
        """Raises."""
        raise RuntimeError("kaput")

    def grade(self, final_text: str | None) -> float:
        return 1.0 if final_text == "done" else 0.5


class ToyEnv(Environment):
    name = "toy"

    def __init__(self, approve_ok: bool = True) -> None:
        self.log: list[tuple[str, dict[str, object]]] = []
        self.approve_ok = approve_ok

    def tasks(self) -> Sequence[Task]:
        return [Task("t1", "do the thing")]

    def start(self, task: Task) -> ToyWorld:
        return ToyWorld(self.log, self.approve_ok)


async def run(
    script: Sequence[Step],
    env: Environment | None = None,
    budget: int = 64,
    **loop: object,
) -> tuple[Episode, ScriptedProvider, Environment]:
    """Run one episode of `script` against `env` (a fresh ToyEnv by default)."""
    env = env if env is not None else ToyEnv()
    provider = ScriptedProvider(script)
    settings = LoopConfig.model_validate(loop)
    spec = EpisodeSpec(
        "run", "model", "scripted", budget, env.tasks()[0], sample=0, seed=7, env_name=env.name
    )
    episode = await run_episode(spec, provider, env, settings)
    if episode.stop_reason is not StopReason.ERROR:
        assert_settled(episode)
    return episode, provider, env
