"""Harness gateway overhead: CPU per proxied turn and turns/s, against the collector's own loop.

The same arithmetic episodes (`bench-zero` or `bench-lat`-like latency set per request) run
two ways against one simulator in its own process, interleaved round by round:

- ``loop``: `run_episode`, the collector's own loop (adapter, tools, records);
- ``gateway``: a `HarnessSession` per episode on a `GatewayServer` in this process, the
  harnesses (bare httpx calculator loops, `bench.harness_driver`) in a child process; each
  session's record is built as the worker builds it (`run_harness_episode`'s `record_episode`).

CPU per turn is `time.process_time()` of this process over the turns it served: the loop's
work in one case, the gateway's (uvicorn's HTTP, parsing, the session, the adapter, the
record) in the other. Turns/s at `--latency-ms` (50 by default) compares their throughput:
target gateway >= 0.9 of direct. When LiteLLM's proxy is installed
(`../shared/tools/real-gateway/setup_gateway.sh`, its own venv), a third variant, ``litellm``,
sends the same harness requests through it to the same simulator, and its process tree's CPU
per request is set beside the gateway's: target gateway <= 1/5 of LiteLLM's.

    .venv/bin/python -m bench.harness_gateway [--episodes 200] [--in-flight 32] [--rounds 3]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, Clock, SimProcess, median, parser, report
from collector.config import LoopConfig
from collector.envs.arithmetic import ArithmeticEnv
from collector.episode.loop import EpisodeSpec, record_episode, run_episode
from collector.harness.gateway import Gateway, GatewayServer
from collector.harness.session import HarnessSession
from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint
from collector.providers.transport import fast_client
from collector.stop import StopReason
from collector.turn import SamplingParams

MODEL = "bench-zero"
BUDGET = 400


def _specs(episodes: int, latency_ms: int) -> list[EpisodeSpec]:
    tasks = ArithmeticEnv(num_tasks=episodes, seed=11).tasks()
    headers = {"x-sim-latency-ms": str(latency_ms)}
    return [
        EpisodeSpec(
            run_id="bench",
            model=MODEL,
            provider_kind="sim",
            budget=BUDGET,
            task=t,
            seed=i,
            sampling=SamplingParams(extra_headers={**headers, "x-sim-seed": str(i)}),
        )
        for i, t in enumerate(tasks)
    ]


async def run_loop(specs: list[EpisodeSpec], in_flight: int, sim_root: str) -> tuple[Clock, int]:
    env = ArithmeticEnv(num_tasks=len(specs), seed=11)
    client = fast_client()
    provider = build_provider("chat", Endpoint(base_url_for("chat", sim_root)), client)
    gate = asyncio.Semaphore(in_flight)
    loop = LoopConfig()

    async def one(spec: EpisodeSpec) -> int:
        async with gate:
            return len((await run_episode(spec, provider, env, loop)).turns)

    clock = Clock()
    turns = sum(await asyncio.gather(*(one(s) for s in specs)))
    clock.stop()
    await client.aclose()
    return clock, turns


async def run_gateway(specs: list[EpisodeSpec], in_flight: int, sim_root: str) -> tuple[Clock, int]:
    client = fast_client()
    provider = build_provider("chat", Endpoint(base_url_for("chat", sim_root)), client)
    gateway = Gateway()
    server = GatewayServer(gateway)
    await server.start()
    loop = LoopConfig()
    sessions = [HarnessSession(s, provider, loop) for s in specs]
    for session in sessions:
        gateway.open(session)
    job = {
        "base_url": server.root + "/v1",
        "in_flight": in_flight,
        "episodes": [{"token": s.token, "prompt": s.spec.task.prompt} for s in sessions],
    }
    clock, out = await _harnesses(job)
    for session in sessions:  # what the worker does at each episode's end
        reason = session.reason or StopReason.DONE
        session.end(reason)
        gateway.close(session)
        session.finish()
        record_episode(session.spec, "harness", session.state, reason, (1.0, 1.0), None, session.offered, 0.0)
    clock.stop()
    await server.stop()
    await client.aclose()
    turns = sum(len(s.state.turns) for s in sessions)
    assert int(out) == turns, "every request the harnesses sent was a turn"
    return clock, turns


async def _harnesses(job: dict[str, Any]) -> tuple[Clock, bytes]:
    """Run the harnesses' process on `job`; the clock starts once it is up (its start-up is not timed)."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.harness_driver", cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert child.stdout is not None
    await child.stdout.readline()
    clock = Clock()
    out, _ = await child.communicate(json.dumps(job).encode() + b"\n")
    return clock, out


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its children (psutil)."""
    import psutil

    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        times = proc.cpu_times()
        total += times.user + times.system
    return total


async def run_litellm(
    specs: list[EpisodeSpec], in_flight: int, proxy: tuple[str, str, int]
) -> tuple[Clock, int]:
    """The same harness traffic through LiteLLM's proxy: the clock's CPU is the proxy's (its process tree)."""
    root, key, pid = proxy
    job = {
        "base_url": root + "/v1",
        "in_flight": in_flight,
        "model": MODEL,
        "episodes": [{"token": key, "prompt": s.task.prompt} for s in specs],
    }
    before = _tree_cpu_s(pid)
    clock, out = await _harnesses(job)
    clock.stop()
    clock.cpu = _tree_cpu_s(pid) - before
    return clock, int(out)


@contextlib.contextmanager
def litellm_proxy(executable: str, sim_root: str) -> Iterator[tuple[str, str, int]]:
    """LiteLLM's proxy (its own venv: ../shared/tools/real-gateway) forwarding to the simulator."""
    import secrets
    import tempfile
    import urllib.request

    from bench.common import free_port

    port, key = free_port(), "sk-" + secrets.token_hex(16)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "litellm.yaml"
        config.write_text(
            f"model_list:\n  - model_name: {MODEL}\n    litellm_params:\n"
            f"      model: openai/{MODEL}\n      api_base: {sim_root}/v1\n      api_key: none\n"
            "litellm_settings:\n  num_retries: 0\n"
        )
        env = {
            **os.environ,
            "LITELLM_MASTER_KEY": key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "NO_COLOR": "1",
        }
        with (Path(tmp) / "litellm.log").open("wb") as log:
            proc = subprocess.Popen(
                [
                    executable,
                    "--config",
                    str(config),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--num_workers",
                    "1",
                ],
                env=env,
                stdout=log,
                stderr=log,
            )
            try:
                deadline = time.monotonic() + 240
                while True:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            "LiteLLM's proxy did not start: " + (Path(tmp) / "litellm.log").read_text()[-500:]
                        )
                    with contextlib.suppress(OSError):
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/health/liveliness", timeout=2)
                        break
                    time.sleep(0.5)
                yield f"http://127.0.0.1:{port}", key, proc.pid
            finally:
                proc.terminate()
                proc.wait(30)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--in-flight", type=int, default=32)
    p.add_argument("--latency-ms", type=int, default=50)
    p.add_argument(
        "--litellm",
        default=str(Path.home() / ".cache/real-wires/litellm-venv/bin/litellm"),
        help="LiteLLM's proxy (../shared/tools/real-gateway/setup_gateway.sh); skipped if absent",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.episodes, args.in_flight, args.rounds = 12, 4, 1
    rounds = args.rounds or 3
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        sim = stack.enter_context(SimProcess())
        proxy = None
        if Path(args.litellm).exists() and not args.quick:
            proxy = stack.enter_context(litellm_proxy(args.litellm, sim.root))
        for r in range(rounds):
            for latency in (0, args.latency_ms):
                specs = _specs(args.episodes, latency)
                for name, run in (("loop", run_loop), ("gateway", run_gateway)):
                    clock, turns = asyncio.run(run(specs, args.in_flight, sim.root))
                    rows.append(
                        {
                            "round": r,
                            "variant": name,
                            "latency_ms": latency,
                            "turns": turns,
                            "cpu_ms_per_turn": round(1000 * clock.cpu / turns, 3),
                            "turns_per_s": round(turns / clock.wall, 1),
                        }
                    )
            if proxy is not None:  # CPU per request only: LiteLLM does not pass the latency header on
                clock, turns = asyncio.run(run_litellm(_specs(args.episodes, 0), args.in_flight, proxy))
                rows.append(
                    {
                        "round": r,
                        "variant": "litellm",
                        "latency_ms": 0,
                        "turns": turns,
                        "cpu_ms_per_turn": round(1000 * clock.cpu / turns, 3),
                        "turns_per_s": round(turns / clock.wall, 1),
                    }
                )

    def med(variant: str, latency: int, key: str) -> float:
        return median(
            [row[key] for row in rows if row["variant"] == variant and row["latency_ms"] == latency]
        )

    summary = [
        {
            "variant": v,
            "cpu_ms_per_turn@0ms": med(v, 0, "cpu_ms_per_turn"),
            f"turns_per_s@{args.latency_ms}ms": med(v, args.latency_ms, "turns_per_s"),
        }
        for v in ("loop", "gateway")
    ]
    summary.append(
        {
            "variant": "gateway / loop",
            "cpu_ms_per_turn@0ms": round(
                med("gateway", 0, "cpu_ms_per_turn") / med("loop", 0, "cpu_ms_per_turn"), 2
            ),
            f"turns_per_s@{args.latency_ms}ms": round(
                med("gateway", args.latency_ms, "turns_per_s") / med("loop", args.latency_ms, "turns_per_s"),
                3,
            ),
        }
    )
    if proxy is not None:
        litellm_cpu = med("litellm", 0, "cpu_ms_per_turn")
        summary.append({"variant": "litellm", "cpu_ms_per_turn@0ms": litellm_cpu})
        summary.append(
            {
                "variant": "gateway / litellm",
                "cpu_ms_per_turn@0ms": round(med("gateway", 0, "cpu_ms_per_turn") / litellm_cpu, 3),
            }
        )
    notes = [
        f"{args.episodes} arithmetic episodes, {MODEL} at budget {BUDGET}, {args.in_flight} in flight, "
        f"{rounds} rounds (median); turns/s at {args.latency_ms} ms per reply: "
        "target gateway >= 0.9 of the loop",
        "litellm: LiteLLM's proxy (one worker) forwarding the same harness requests to the same simulator; "
        "its CPU is its process tree's; target gateway / litellm <= 0.2"
        if proxy is not None
        else "LiteLLM's proxy on the same requests: not measured (no LiteLLM venv found)",
    ]
    return report(
        "harness_gateway",
        "Harness gateway: CPU per proxied turn and turns/s vs the loop",
        args,
        rows,
        summary,
        notes,
    )


if __name__ == "__main__":
    main()
