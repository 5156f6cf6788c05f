"""`collector run` end to end (driver, Ray, worker, commits) against Little's bound.

    .venv/bin/python -m bench.e2e                          # 64 and 256 in flight, 50 ms, 3 rounds
    .venv/bin/python -m bench.e2e --before 6bb5ebe cd105b2 # also those commits, interleaved

Each measurement is one real `collector run` subprocess (one worker, the arithmetic
environment's two-turn tool episode, Chat Completions) against `bench.fastserver` (canned
replies, fixed latency). The server is pinned to one core and every process of the run
(driver, Ray's daemons, the worker) to the other (`taskset`), so they never share a core.
The window is steady: it opens `--warmup` seconds after the first completion is served
(Ray's start-up and the workers' start are excluded) and lasts `--window` seconds; turns
are the completions the server served in it (`GET /count`). Then the run is interrupted
(SIGINT: it commits what finished and exits). Bound = in flight / latency.

`--before REV...` extracts `collector/` of each commit into a temporary directory and runs
the same measurement with it first on PYTHONPATH (the before figure of a change, side by
side, interleaved round by round).
`cpu_us_turn` is the CPU of the run's whole process tree in the window, per turn; with one
core, 1 / cpu_us_turn is the run's CPU bound, and `x_min_bound` is turns/s over the lower
of that and Little's bound (the core is shared with other jobs on a busy machine:
`client_util` says how much of it the run got).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, free_port, median, parser, report

CONFIG = """\
name = "e2e"
samples_per_task = {samples}
[provider]
kind = "chat"
base_url = "http://127.0.0.1:{port}/v1"
[sweep]
models = ["fake"]
budgets = [256]
[env]
name = "arithmetic"
[env.options]
num_tasks = 1000
[ray]
workers = 1
episodes_in_flight = {in_flight}
temp_dir = "{tmp}/ray"
[output]
path = "{tmp}/run"
"""


def _count(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/count", timeout=5) as r:
        return int(r.read())


def _tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) of `root` and every live descendant, from /proc."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    ticks = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
            parents[int(entry)] = int(parts[1])
            cpu[int(entry)] = (int(parts[11]) + int(parts[12])) / ticks
    total = 0.0
    for pid in cpu:
        p = pid
        while p > 1 and p != root:
            p = parents.get(p, 0)
        if p == root:
            total += cpu[pid]
    return total


def _one(port: int, in_flight: int, latency_s: float, warmup: float, window: float,
         pythonpath: str | None, variant: str, extra_env: dict[str, str]) -> dict[str, Any]:
    # Enough episodes that the run is still going when the window closes.
    samples = max(2, int((in_flight / latency_s) * (warmup + window + 30) / 2 / 1000) + 1)
    with tempfile.TemporaryDirectory(prefix="e2e-") as tmp:
        cfg = Path(tmp) / "config.toml"
        cfg.write_text(CONFIG.format(samples=samples, port=port, in_flight=in_flight, tmp=tmp))
        env = dict(os.environ)
        env.pop("RAY_ADDRESS", None)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        env.update(extra_env)
        # cwd is the temporary directory: `-m` puts the cwd first on sys.path, which would
        # shadow a PYTHONPATH tree with this one.
        which = subprocess.run([sys.executable, "-c", "import collector; print(collector.__file__)"],
                               cwd=tmp, env=env, capture_output=True, text=True, check=True).stdout.strip()
        cmd = ["taskset", "-c", "0", sys.executable, "-m", "collector", "run", str(cfg), "--quiet"]
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            start = _count(port)
            deadline = time.monotonic() + 180
            while _count(port) == start:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    raise RuntimeError(f"collector run did not start: {err[-800:]}")
                time.sleep(0.05)
            time.sleep(warmup)
            c0, cpu0, t0 = _count(port), _tree_cpu_s(proc.pid), time.perf_counter()
            time.sleep(window)
            c1, cpu1, t1 = _count(port), _tree_cpu_s(proc.pid), time.perf_counter()
            if proc.poll() is not None:
                raise RuntimeError("the run ended inside the window: plan more episodes")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    turns = c1 - c0
    rate = turns / (t1 - t0)
    bound = in_flight / latency_s
    return {"variant": variant, "in_flight": in_flight, "turns_s": rate, "little": bound,
            "x_little": rate / bound, "cpu_us_turn": (cpu1 - cpu0) / max(turns, 1) * 1e6,
            "client_util": (cpu1 - cpu0) / (t1 - t0),
            # One core is all the run has (taskset): 1 core / CPU per turn is its CPU bound.
            "cpu_bound": 1e6 / max((cpu1 - cpu0) / max(turns, 1) * 1e6, 1e-9),
            "code": which}


PEER = """
import asyncio, json, sys, time
from agents import (Agent, FunctionTool, ModelSettings, OpenAIChatCompletionsModel, Runner,
                    set_tracing_disabled)
from openai import AsyncOpenAI
from collector.envs.arithmetic import ArithmeticEnv

port, in_flight, warmup, window = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
env = ArithmeticEnv(1000)
tasks = env.tasks()
ends = []

async def main():
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="not-a-key", max_retries=0)
    model = OpenAIChatCompletionsModel(model="fake", openai_client=client)
    stop = time.perf_counter() + warmup + window + 1
    def wrap(tool):
        async def invoke(_ctx, raw, fn=tool.function):
            return str(fn(**json.loads(raw or "{}")))
        return FunctionTool(name=tool.name, description=tool.description, params_json_schema=tool.parameters,
                            on_invoke_tool=invoke, strict_json_schema=False)
    async def slot(i):
        while time.perf_counter() < stop:
            task = tasks[i % len(tasks)]
            world = env.start(task)
            agent = Agent(name="arith", instructions=None, model=model, tools=[wrap(t) for t in world.tools],
                          model_settings=ModelSettings(max_tokens=256))
            await Runner.run(agent, task.prompt, max_turns=6)
            ends.append(time.perf_counter())
    t0 = time.perf_counter()
    await asyncio.gather(*(slot(i) for i in range(in_flight)))
    await client.close()
    a, b = t0 + warmup, t0 + warmup + window
    print(sum(1 for e in ends if a <= e < b) / window)

asyncio.run(main())
"""


def _peer(port: int, in_flight: int, warmup: float, window: float) -> float:
    """openai-agents' `Runner.run` on the same episodes, pinned like the run: episodes/s."""
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", PEER, str(port), str(in_flight),
                          str(warmup), str(window)], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _extract(rev: str, into: str) -> str:
    archive = subprocess.run(["git", "archive", rev, "collector"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--in-flight", type=int, nargs="+", default=[64, 256])
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--window", type=float, default=6.0)
    p.add_argument("--nice0", action="store_true",
                   help="also run this tree with Ray's workers at nice 0 (Ray starts them at 15)")
    p.add_argument("--peer", action="store_true",
                   help="also openai-agents' Runner on the same episodes, pinned the same way")
    p.add_argument("--before", nargs="*", default=[], help="git revisions to measure beside this tree")
    args = p.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    if args.quick:
        args.in_flight, args.warmup, args.window = [16], 1.0, 1.0
    latency = args.latency_ms / 1000.0
    port = free_port()
    server_env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-m", "bench.fastserver",
                               "--port", str(port), "--latency-ms", str(args.latency_ms)],
                              cwd=ROOT, env=server_env)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="e2e-before-") as before_dir:
        variants: list[tuple[str, str | None, dict[str, str]]] = [("this tree", None, {})]
        if args.nice0:
            variants.append(("this tree, workers nice 0", None, {"RAY_worker_niceness": "0"}))
        for rev in args.before:
            tree = Path(before_dir) / rev
            tree.mkdir()
            variants.append((rev, _extract(rev, str(tree)), {}))
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    _count(port)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            for r in range(rounds):
                for in_flight in args.in_flight:
                    order = variants[r % len(variants):] + variants[:r % len(variants)]
                    if args.peer:
                        rate = _peer(port, in_flight, args.warmup, args.window)
                        row = {"variant": "openai-agents Runner", "in_flight": in_flight, "turns_s": 2 * rate,
                               "little": in_flight / latency, "x_little": 2 * rate / (in_flight / latency),
                               "cpu_us_turn": float("nan"), "cpu_bound": float("inf"),
                               "client_util": float("nan"), "round": r}
                        rows.append(row)
                        print(row, flush=True)
                    for name, path, extra in order:
                        row = _one(port, in_flight, latency, args.warmup, args.window, path, name, extra)
                        row["round"] = r
                        rows.append(row)
                        print(row, flush=True)
        finally:
            server.terminate()
            server.wait(10)
    summary = []
    names = [name for name, _, _ in variants] + (["openai-agents Runner"] if args.peer else [])
    for in_flight in args.in_flight:
        for name in names:
            mine = [row for row in rows if row["variant"] == name and row["in_flight"] == in_flight]
            summary.append({"variant": name, "in_flight": in_flight,
                            "turns_s": median([m["turns_s"] for m in mine]),
                            "little": mine[0]["little"],
                            "x_little": median([m["x_little"] for m in mine]),
                            "x_little_range": f"{min(m['x_little'] for m in mine):.2f}-"
                                              f"{max(m['x_little'] for m in mine):.2f}",
                            "cpu_us_turn": median([m["cpu_us_turn"] for m in mine]),
                            "x_min_bound": median([m["turns_s"] / min(m["little"], m["cpu_bound"])
                                                   for m in mine]),
                            "client_util": median([m["client_util"] for m in mine])})
    if args.peer:  # episodes/s of each variant over the peer's, round by round (2 turns an episode)
        for row in summary:
            ratios = [m["turns_s"] / p["turns_s"] for m in rows for p in rows
                      if m["variant"] == row["variant"] and m["in_flight"] == row["in_flight"]
                      and p["variant"] == "openai-agents Runner" and p["in_flight"] == m["in_flight"]
                      and p["round"] == m["round"]]
            row["x_openai_agents"] = median(ratios)
    return report("e2e", "collector run end to end vs Little's bound (steady window)", args, rows, summary)


if __name__ == "__main__":
    main()
