"""A worker's harness side alone, for the SIGKILL test: one `fork-and-sleep` episode, as the worker runs it.

    python sigkill_worker.py WORKDIR_ROOT

The harness never calls the model, so no provider is needed; the test kills this process with
SIGKILL while the episode is in flight and checks that the harness and its child die too.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from collector.config import LoopConfig
from collector.envs.base import Task
from collector.episode.loop import EpisodeSpec
from collector.harness.env import HarnessEnv
from collector.harness.gateway import Gateway, GatewayServer
from collector.harness.runner import run_harness_episode

MISBEHAVING = Path(__file__).with_name("misbehaving_harness.py")


async def main(root: str) -> None:
    env = HarnessEnv(
        command=[sys.executable, str(MISBEHAVING), "fork-and-sleep", "{task}"],
        workdir_root=root,
        keep_workdir=True,
        grace_s=1,
        timeout_s=300,
    )
    server = GatewayServer(Gateway())
    await server.start()
    spec = EpisodeSpec(run_id="r", model="m", provider_kind="chat", budget=10, task=Task("t", "p"))
    provider: Any = None  # never called: the harness never asks the model
    await run_harness_episode(spec, provider, env, LoopConfig(), server.gateway, server.root)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
