"""A peer on the same work: the openai-agents SDK's `Runner` against the collector.

Issue 6, item 1f. Both run the same tool-calling episodes (the `support_desk` tasks: the
same prompts, the same tools with the same JSON schemas and the same functions, each
episode in its own fresh world) against the same simulator (`bench-zero` over Chat
Completions, in its own process), with the same number of episodes in flight, kept full.

- ``collector``: `EpisodeWorker.run_batch` plus the shard commit (as in bench/overhead.py);
- ``openai-agents``: `Runner.run(agent, task.prompt, max_turns=6)` per episode with an
  `OpenAIChatCompletionsModel` over one `AsyncOpenAI` client, tracing off, each world's
  tools wrapped as `FunctionTool`s. Nothing is recorded or written: the peer does less.

Target: collector >= 3x the peer's episodes/s. The peer is optional: without the
`openai-agents` package the script says so and writes a row saying so.

    .venv/bin/python -m bench.peer [--episodes 480] [--in-flight 64] [--rounds 3]
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from collections import deque
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Clock, SimProcess, median, parser, report
from bench.workload import items_for, make_config, run_collector
from collector.envs.base import Environment, Task
from collector.run.plan import load_env

NAME = "peer"


async def run_agents_sdk(env: Environment, tasks: list[Task], in_flight: int, root: str) -> int:
    """Episodes through the openai-agents Runner; returns the model turns it made."""
    from agents import (
        Agent,
        FunctionTool,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=root + "/v1", api_key="not-a-key", max_retries=0)
    model = OpenAIChatCompletionsModel(model="bench-zero", openai_client=client)
    queue = deque(tasks)
    turns = 0

    def wrap(tool: Any) -> Any:
        async def invoke(_ctx: Any, raw: str, fn: Any = tool.function) -> str:
            return str(fn(**json.loads(raw or "{}")))

        return FunctionTool(name=tool.name, description=tool.description, params_json_schema=tool.parameters,
                            on_invoke_tool=invoke, strict_json_schema=False)

    async def slot() -> None:
        nonlocal turns
        while queue:
            task = queue.popleft()
            world = env.start(task)
            agent = Agent(name="support", instructions=None, model=model,
                          tools=[wrap(t) for t in world.tools],
                          model_settings=ModelSettings(max_tokens=256))
            prompt = task.prompt if isinstance(task.prompt, str) else str(task.prompt)
            try:
                result = await Runner.run(agent, prompt, max_turns=6)
                turns += len(result.raw_responses)
            except Exception as exc:  # noqa: BLE001 - a peer episode that fails still counts as run
                turns += 1
                del exc

    try:
        await asyncio.gather(*(slot() for _ in range(in_flight)))
    finally:
        await client.close()
    return turns


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=480)
    p.add_argument("--in-flight", type=int, default=64)
    args = p.parse_args(argv)
    if args.quick:
        args.episodes, args.in_flight, args.rounds = 12, 4, args.rounds or 1
    args.rounds = args.rounds or 3
    try:
        import agents  # noqa: F401
    except ImportError:
        row = {"variant": "openai-agents", "status": "not installed: pip install openai-agents"}
        return report(NAME, "Peer: collector vs openai-agents Runner", args, [], [row])
    cfg = make_config("bench-zero", args.episodes, args.in_flight)
    items = items_for(cfg, args.episodes)
    env = load_env(cfg)
    by_id = {t.id: t for t in env.tasks()}
    tasks = [by_id[i.task_id] for i in items]

    rows: list[dict[str, Any]] = []

    async def measure() -> None:
        with SimProcess() as sim:
            async def collector() -> int:
                turns, _ = await run_collector(cfg, items, sim.root)
                return turns

            variants = {"collector": collector,
                        "openai-agents": lambda: run_agents_sdk(env, tasks, args.in_flight, sim.root)}
            await run_agents_sdk(env, tasks[:4], 4, sim.root)  # warm-up: imports, first connections
            for rnd in range(args.rounds):
                order = list(variants) if rnd % 2 == 0 else list(reversed(variants))
                for name in order:
                    gc.collect()
                    clock = Clock()
                    turns = await variants[name]()
                    clock.stop()
                    rows.append({"round": rnd, "variant": name, "episodes": len(items), "turns": turns,
                                 "episodes_per_s": len(items) / clock.wall,
                                 "cpu_ms_per_episode": 1000 * clock.cpu / len(items),
                                 "cpu_ms_per_turn": 1000 * clock.cpu / max(turns, 1),
                                 "cpu_util": clock.cpu / clock.wall})

    asyncio.run(measure())
    summary = []
    for name in ("collector", "openai-agents"):
        mine = [r for r in rows if r["variant"] == name]
        ratios = [r["episodes_per_s"] / next(x["episodes_per_s"] for x in rows
                                             if x["round"] == r["round"] and x["variant"] == "openai-agents")
                  for r in mine]
        summary.append({"variant": name, **{k: median([r[k] for r in mine]) for k in
                                            ("episodes_per_s", "cpu_ms_per_episode", "cpu_ms_per_turn",
                                             "cpu_util")},
                        "x_vs_openai_agents": median(ratios)})
    notes = [f"{len(items)} support_desk episodes per variant per round, {args.in_flight} in flight, "
             f"zero-latency simulator; {args.rounds} rounds", "target: collector >= 3x openai-agents"]
    return report(NAME, "Peer: collector vs openai-agents Runner", args, rows, summary, notes)


if __name__ == "__main__":
    main()
