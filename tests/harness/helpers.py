"""What the gateway tests share: a sweep of harness episodes in-process, and one-turn requests.

Everything runs through `httpx.ASGITransport`: the gateway's app in front of the simulator's.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from collector.config import LoopConfig
from collector.envs.arithmetic import ArithmeticEnv
from collector.envs.base import Task
from collector.episode.loop import EpisodeSpec
from collector.harness.gateway import Gateway, episode_root
from collector.harness.session import HarnessSession
from collector.providers import build_provider
from collector.providers.base import Endpoint, Provider
from collector.sim.app import create_app
from collector.turn import SamplingParams, Turn, TurnRequest

TASKS = ArithmeticEnv(num_tasks=12, seed=3).tasks()
#: Small budgets at which the simulator cuts calls whose arguments already parse: the turns a
#: recording proxy lets a harness run (a hidden cut says `tool_calls`, a plain one `length`).
CELLS = (
    ("sim-hidden-cut", 40),
    ("sim-hidden-cut", 48),
    ("sim-terse", 8),
    ("sim-terse", 16),
    ("sim-verbose", 32),
)
CALCULATOR_PARAMETERS = {"type": "object", "properties": {"expression": {"type": "string"}}}

#: Runs one harness against the gateway: (gateway's ASGI app, the episode's root URL on it
#: (`http://gateway/e/<key>`), episode token, task, working dir).
Drive = Callable[[Any, str, str, Task, Path], Awaitable[None]]


class Seen:
    """The provider adapter, keeping every turn it returned (what the model really did)."""

    def __init__(self, inner: Provider) -> None:
        self.inner, self.kind, self.turns = inner, inner.kind, list[Turn]()

    async def complete(self, request: TurnRequest) -> Turn:
        turn = await self.inner.complete(request)
        self.turns.append(turn)
        return turn


def logged(workdir: Path) -> list[dict[str, Any]]:
    """The executions a harness logged in its working directory."""
    path = workdir / "executions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def sweep(
    tmp_path: Path,
    drive: Drive,
    *,
    enforce: bool,
    cells: Sequence[tuple[str, int]] = CELLS,
    tasks: Sequence[Task] = TASKS,
) -> tuple[int, int, list[str]]:
    """(cut turns, executions, executions whose call came from a cut turn) over `cells` x `tasks`."""
    gateway = Gateway()
    cut_turns = executions = 0
    from_cut: list[str] = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(0))) as sim:
        for model, budget in cells:
            for i, task in enumerate(tasks):
                spec = EpisodeSpec(
                    run_id="r",
                    model=model,
                    provider_kind="sim",
                    budget=budget,
                    task=task,
                    seed=i,
                    sampling=SamplingParams(extra_headers={"x-sim-seed": str(i)}),
                )
                provider = Seen(
                    build_provider("chat", Endpoint("http://sim/v1", api_key="sk-provider-1"), sim)
                )
                session = HarnessSession(spec, provider, LoopConfig(), enforce=enforce)
                gateway.open(session)
                workdir = tmp_path / f"{model}-{budget}-{i}"
                workdir.mkdir(parents=True)
                root = episode_root("http://gateway", session)
                await drive(gateway.app, root, session.token, task, workdir)
                gateway.close(session)
                ran = logged(workdir)
                cut_ids = {c.id for t in provider.turns if t.is_length for c in t.tool_calls}
                cut_turns += sum(1 for t in provider.turns if t.is_length)
                executions += len(ran)
                from_cut += [e["id"] for e in ran if e["id"] in cut_ids]
    return cut_turns, executions, from_cut


async def post_twice(
    path: str,
    body: dict[str, Any],
    model: str,
    budget: int,
    task: Task,
    auth: Callable[[str], dict[str, str]],
) -> tuple[HarnessSession, httpx.Response, httpx.Response]:
    """One episode's first request and the same request again, at `path` under the episode's root:
    (its session, both replies)."""
    gateway = Gateway()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(0))) as sim:
        spec = EpisodeSpec(run_id="r", model=model, provider_kind="sim", budget=budget, task=task)
        session = HarnessSession(spec, build_provider("chat", Endpoint("http://sim/v1"), sim), LoopConfig())
        gateway.open(session)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=gateway.app), base_url=episode_root("http://gw", session)
        ) as c:
            first = await c.post(path, json=body, headers=auth(session.token))
            again = await c.post(path, json=body, headers=auth(session.token))
    return session, first, again


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}
