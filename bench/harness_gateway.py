"""Harness gateway overhead: CPU per proxied turn, and turns/s against direct and the loop.

The same arithmetic episodes (`bench-zero`, the reply latency set per request) against one
simulator in its own process, every variant interleaved round by round in one run:

- ``loop``: `run_episode`, the collector's own loop (adapter, tools, records), in this process;
- ``direct``: the harnesses (bare httpx calculator loops, `bench.harness_driver`, one child
  process) straight to the simulator, sending what the gateway would add (the cell's cap, the
  seed, the latency and seed headers): how fast the same agents run without the gateway;
- ``gateway``: the same harness process through a `GatewayServer` in this process, a
  `HarnessSession` per episode, each opened, closed and recorded as the worker does;
- ``litellm`` (when its venv exists, `../shared/tools/real-gateway/setup_gateway.sh`): the same
  harness process through LiteLLM's proxy to the same simulator; CPU per request only.

CPU per turn is `time.process_time()` of this process (the loop's work, or the gateway's:
uvicorn's HTTP, parsing, the session, the adapter, the record), LiteLLM's process tree's;
each row also holds the harness process's CPU per request, the simulator's CPU per turn and
the request latency percentiles the harness saw. Targets: gateway / litellm CPU <= 0.2, and
gateway / direct turns/s >= 0.9 at `--latency-ms` (50), printed over the in-flight counts of
`--curve` (1, 4, 16, 32) so the reader sees where each path saturates.

    .venv/bin/python -m bench.harness_gateway [--episodes 200] [--in-flight 16] [--rounds 3]
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
from dataclasses import dataclass, field
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


@dataclass(slots=True)
class Run:
    """One variant's pass over the episodes: its clock, the turns served, the harnesses' own line."""

    clock: Clock
    turns: int
    harness: dict[str, Any] = field(default_factory=dict)
    sim_cpu_ms: float = float("nan")
    """The simulator's CPU per turn over this pass (set by the caller, which owns the simulator)."""


async def run_loop(specs: list[EpisodeSpec], in_flight: int, sim_root: str) -> Run:
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
    return Run(clock, turns)


async def run_direct(specs: list[EpisodeSpec], in_flight: int, sim_root: str) -> Run:
    """The same harnesses straight to the simulator: what the gateway adds to each request (the
    cell's cap, the seed, the latency and seed headers) they send themselves, so both paths ask
    for the same turns. The clock's CPU is this (idle) process's: the figures here are turns/s."""
    job = {
        "base_url": sim_root + "/v1",
        "in_flight": in_flight,
        "model": MODEL,
        "body": {"max_completion_tokens": BUDGET},
        "episodes": [
            {"token": "none", "prompt": s.task.prompt, "headers": dict(s.sampling.extra_headers),
             "body": {"seed": s.seed}}
            for s in specs
        ],
    }
    clock, out = await _harnesses(job)
    clock.stop()
    return Run(clock, out["requests"], out)


async def run_gateway(specs: list[EpisodeSpec], in_flight: int, sim_root: str) -> Run:
    client = fast_client()
    provider = build_provider("chat", Endpoint(base_url_for("chat", sim_root)), client)
    gateway = Gateway()
    server = GatewayServer(gateway)
    await server.start()
    loop = LoopConfig()
    # Opening a session is per-episode work of the gateway (its token, its redactor): timed
    # here and added to the clock, which starts once the harnesses' process is up.
    opening = Clock()
    sessions = [HarnessSession(s, provider, loop) for s in specs]
    for session in sessions:
        gateway.open(session)
    opening.stop()
    job = {
        "base_url": server.root + "/v1",
        "in_flight": in_flight,
        "episodes": [
            {"token": s.token, "prompt": s.spec.task.prompt, "base_url": _episode_base_url(server.root, s)}
            for s in sessions
        ],
    }
    clock, out = await _harnesses(job)
    for session in sessions:  # what the worker does at each episode's end
        reason = session.reason or StopReason.DONE
        session.end(reason)
        gateway.close(session)
        session.finish()
        record_episode(session.spec, "harness", session.state, reason, (1.0, 1.0), None, session.offered, 0.0)
    clock.stop()
    clock.cpu += opening.cpu
    clock.wall += opening.wall
    await server.stop()
    await client.aclose()
    turns = sum(len(s.state.turns) for s in sessions)
    assert out["requests"] == turns, "every request the harnesses sent was a turn"
    return Run(clock, turns, out)


def _episode_base_url(server_root: str, session: HarnessSession) -> str:
    """The harness's OpenAI base URL: the episode's own root (`/e/<key>/v1`) where the gateway
    serves each episode under one, the server's `/v1` where it tells episodes by token alone
    (both gateways exist until the branch that moves to per-episode roots is merged)."""
    key = getattr(session, "key", None)
    return f"{server_root}/e/{key}/v1" if key else f"{server_root}/v1"


async def _harnesses(job: dict[str, Any]) -> tuple[Clock, dict[str, Any]]:
    """Run the harnesses' process on `job`; the clock starts once it is up (its start-up is not timed).

    Returns the clock (stopped by the caller) and the driver's line: requests sent, its CPU, its
    latency percentiles."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.harness_driver", cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert child.stdout is not None
    await child.stdout.readline()
    clock = Clock()
    out, _ = await child.communicate(json.dumps(job).encode() + b"\n")
    result: dict[str, Any] = json.loads(out)
    return clock, result


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its children (psutil)."""
    import psutil

    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        times = proc.cpu_times()
        total += times.user + times.system
    return total


async def run_litellm(specs: list[EpisodeSpec], in_flight: int, proxy: tuple[str, str, int]) -> Run:
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
    return Run(clock, out["requests"], out)


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


VARIANTS = {"loop": run_loop, "direct": run_direct, "gateway": run_gateway}


def _row(r: int, name: str, in_flight: int, latency: int, run: Run) -> dict[str, Any]:
    harness = run.harness
    lat = harness.get("latency_ms", {})
    return {
        "round": r,
        "variant": name,
        "in_flight": in_flight,
        "latency_ms": latency,
        "turns": run.turns,
        "cpu_ms_per_turn": round(1000 * run.clock.cpu / run.turns, 3),
        "harness_cpu_ms_per_req": round(1000 * harness["cpu_s"] / run.turns, 3) if harness else float("nan"),
        "sim_cpu_ms_per_turn": run.sim_cpu_ms,
        "turns_per_s": round(run.turns / run.clock.wall, 1),
        "p50_ms": lat.get("p50", float("nan")),
        "p90_ms": lat.get("p90", float("nan")),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--in-flight", type=int, default=16, help="in flight for the CPU-per-turn figures")
    p.add_argument("--curve", default="1,4,16,32", help="in-flight counts for turns/s at --latency-ms")
    p.add_argument("--latency-ms", type=int, default=50)
    p.add_argument(
        "--litellm",
        default=str(Path.home() / ".cache/real-wires/litellm-venv/bin/litellm"),
        help="LiteLLM's proxy (../shared/tools/real-gateway/setup_gateway.sh); skipped if absent",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.episodes, args.in_flight, args.rounds, args.curve = 12, 4, 1, "4"
    rounds = args.rounds or 3
    curve = [int(n) for n in args.curve.split(",")]
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        sim = stack.enter_context(SimProcess())
        proxy = None
        if Path(args.litellm).exists() and not args.quick:
            proxy = stack.enter_context(litellm_proxy(args.litellm, sim.root))

        def measure(r: int, name: str, in_flight: int, latency: int, episodes: int) -> None:
            before = sim.cpu_s()
            run = asyncio.run(VARIANTS[name](_specs(episodes, latency), in_flight, sim.root))
            run.sim_cpu_ms = round(1000 * (sim.cpu_s() - before) / run.turns, 3)
            rows.append(_row(r, name, in_flight, latency, run))

        for r in range(rounds):
            # The order turns each round, so that no variant always runs first after a pause.
            order = list(VARIANTS)[r % 3:] + list(VARIANTS)[: r % 3]
            for name in order:  # CPU per turn, replies at once
                measure(r, name, args.in_flight, 0, args.episodes)
            if proxy is not None:  # CPU per request only: LiteLLM does not pass the latency header on
                run = asyncio.run(run_litellm(_specs(args.episodes, 0), args.in_flight, proxy))
                rows.append(_row(r, "litellm", args.in_flight, 0, run))
            for n in curve:  # turns/s at --latency-ms; about 12 episodes a slot (the curve's low end is slow)
                for name in order:
                    measure(r, name, n, args.latency_ms, min(args.episodes, max(24, 12 * n)))

    def med(variant: str, in_flight: int, latency: int, key: str) -> float:
        return median([row[key] for row in rows
                       if row["variant"] == variant and row["in_flight"] == in_flight
                       and row["latency_ms"] == latency])

    def ratio(a: float, b: float, digits: int = 3) -> float:
        return round(a / b, digits) if b == b and b else float("nan")

    n0 = args.in_flight
    cpu = {v: med(v, n0, 0, "cpu_ms_per_turn") for v in ("loop", "gateway", "litellm")}
    summary: list[dict[str, Any]] = [{
        "measure": f"CPU ms/turn, 0 ms replies, {n0} in flight",
        "loop": cpu["loop"], "gateway": cpu["gateway"], "litellm": cpu["litellm"],
        "gateway/loop": ratio(cpu["gateway"], cpu["loop"], 2),
        "gateway/litellm": ratio(cpu["gateway"], cpu["litellm"]),
    }]
    summary.append({
        "measure": f"harnesses' CPU ms/request, 0 ms replies, {n0} in flight",
        "direct": med("direct", n0, 0, "harness_cpu_ms_per_req"),
        "gateway": med("gateway", n0, 0, "harness_cpu_ms_per_req"),
        "litellm": med("litellm", n0, 0, "harness_cpu_ms_per_req"),
    })
    summary.append({
        "measure": f"simulator CPU ms/turn, 0 ms replies, {n0} in flight",
        "loop": med("loop", n0, 0, "sim_cpu_ms_per_turn"),
        "direct": med("direct", n0, 0, "sim_cpu_ms_per_turn"),
        "gateway": med("gateway", n0, 0, "sim_cpu_ms_per_turn"),
    })
    def paired(n: int) -> float:
        """The median over rounds of gateway / direct within one round: the two ran back to back,
        so a load that changes between rounds moves both (the ratio of medians mixes rounds)."""
        by_round: dict[int, dict[str, float]] = {}
        for row in rows:
            if row["in_flight"] == n and row["latency_ms"] == args.latency_ms:
                by_round.setdefault(row["round"], {})[row["variant"]] = row["turns_per_s"]
        return round(median([r["gateway"] / r["direct"] for r in by_round.values()]), 3)

    for n in curve:
        tps = {v: med(v, n, args.latency_ms, "turns_per_s") for v in VARIANTS}
        summary.append({
            "measure": f"turns/s, {args.latency_ms} ms replies, {n} in flight",
            **tps,
            "gateway/direct": ratio(tps["gateway"], tps["direct"]),
            "gateway/direct by round": paired(n),
            "gateway/loop": ratio(tps["gateway"], tps["loop"]),
        })
    columns = ["measure", "loop", "direct", "gateway", "litellm", "gateway/direct", "gateway/direct by round",
               "gateway/loop", "gateway/litellm"]
    summary = [{c: row.get(c, "") for c in columns} for row in summary]

    def spread(variant: str, n: int) -> str:
        return f"{med(variant, n, args.latency_ms, 'p50_ms')} / {med(variant, n, args.latency_ms, 'p90_ms')}"

    for n in curve:
        summary.append({"measure": f"request p50 / p90 ms as the harness sees it, {n} in flight",
                        "direct": spread("direct", n), "gateway": spread("gateway", n)})
    load = os.getloadavg()
    notes = [
        f"{args.episodes} arithmetic episodes ({MODEL}, budget {BUDGET}; about 12 a slot on the curve), "
        f"{rounds} rounds interleaved (median); load average at the end {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f} on {os.cpu_count()} cores",
        "direct: the same harnesses' process straight to the simulator; target gateway/direct >= 0.9 "
        f"at {args.latency_ms} ms replies",
        "litellm: LiteLLM's proxy (one worker) forwarding the same harness requests to the same simulator; "
        "its CPU is its process tree's; target gateway/litellm <= 0.2"
        if proxy is not None
        else "LiteLLM's proxy on the same requests: not measured (no LiteLLM venv found)",
    ]
    return report(
        "harness_gateway",
        "Harness gateway: CPU per proxied turn and turns/s vs direct, the loop and LiteLLM",
        args,
        rows,
        summary,
        notes,
    )


if __name__ == "__main__":
    main()
