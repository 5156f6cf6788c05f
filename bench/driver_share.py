"""The driver's share: `collector run`'s whole process tree against the worker alone (issue 29).

    .venv/bin/python -m bench.driver_share                       # 64 in flight, 50 ms, 3 rounds
    .venv/bin/python -m bench.driver_share --before ad006c2      # also that commit, interleaved

Same work for both sides: `bench.fastserver` (canned two-turn tool episode, fixed latency)
pinned to core 1, the e2e config of `bench.e2e` (arithmetic, Chat Completions, one worker,
`--in-flight` episodes in flight), everything measured pinned to core 0 (`taskset`).

- `worker alone`: an `EpisodeWorker` in a plain process (no Ray, no driver), fed the way
  the driver feeds it (batches of `ray.batch_size`, as many outstanding as the driver keeps,
  refilled as each returns; the episodes are dropped);
- `collector run`: a real `collector run` subprocess (progress line on, to a pipe: the
  default, which polls the worker), and every process it starts: the driver, Ray's daemons
  (raylet, GCS, agents, log monitor, idle workers) and the worker actor.

The window opens `--warmup` s after the first completion and lasts `--window` s; turns are
the completions the server served in it (`GET /count`); CPU is user + system of each
process from /proc over the window. `cpu_us_turn` is the tree's CPU per turn; the split
(driver, worker, raylet, gcs, other) is per process, classified by command line.
`x_alone` is a run's CPU per turn over the worker alone's in the same round (target <= 1.3).
`--before REV` runs `collector/` of that commit (on PYTHONPATH) beside this tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, free_port, median, parser, report
from bench.e2e import CONFIG, _count, _extract

NAME = "driver_share"
PARTS = ("driver", "worker", "raylet", "gcs", "other")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of `pid` from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(parts[1]), (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _part(pid: int, root: int) -> str:
    cmd = _cmdline(pid)
    if pid == root:
        return "worker" if "--alone" in cmd else "driver"
    if "_WorkerActor" in cmd:
        return "worker"
    if "raylet" in cmd.split(" ", 1)[0]:
        return "raylet"
    if "gcs_server" in cmd.split(" ", 1)[0]:
        return "gcs"
    return "other"


def tree_cpu(root: int) -> dict[int, tuple[str, str, float]]:
    """Every live process under `root` (itself included): pid -> (part, command, CPU s)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            parents[int(entry)], cpu[int(entry)] = st
    out = {}
    for pid in cpu:
        p = pid
        while p > 1 and p != root:
            p = parents.get(p, 0)
        if p == root:
            out[pid] = (_part(pid, root), _cmdline(pid)[:90], cpu[pid])
    return out


def _split(before: dict[int, tuple[str, str, float]], after: dict[int, tuple[str, str, float]],
           turns: int) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """CPU µs per turn per part, and per process (command, µs/turn), over the window.
    A process born inside the window counts from zero; one that died in it is lost (rare:
    nothing of the tree ends while the run goes on)."""
    parts: Counter[str] = Counter()
    procs = []
    for pid, (part, cmd, cpu) in after.items():
        used = cpu - (before[pid][2] if pid in before else 0.0)
        parts[part] += used
        procs.append((cmd, used / max(turns, 1) * 1e6))
    return ({p: parts[p] / max(turns, 1) * 1e6 for p in PARTS},
            sorted(procs, key=lambda x: -x[1]))


# --- the worker alone ----------------------------------------------------------------------

async def _feed(config_path: str) -> None:
    """Run the plan's items through one EpisodeWorker forever (looping over the plan),
    `ray.batch_size` per batch with the driver's number outstanding."""
    from collector.config import load_config, with_absolute_paths
    from collector.run.plan import plan_work
    from collector.run.worker import EpisodeWorker, WorkerSetup

    cfg = load_config(config_path)
    plan = plan_work(cfg)
    base_urls = tuple(p.base_url or "" for p in plan.providers)
    worker = EpisodeWorker(WorkerSetup(with_absolute_paths(cfg), plan.run_id, base_urls))
    await worker.ready()
    batch = cfg.ray.batch_size
    outstanding = max(2, math.ceil(cfg.ray.episodes_in_flight / batch) + 1)  # Driver._per_worker
    items = plan.items
    pos = 0

    def next_batch() -> list[Any]:
        nonlocal pos
        out = [items[(pos + i) % len(items)] for i in range(batch)]
        pos += batch
        return out

    pending = {asyncio.ensure_future(worker.run_batch(next_batch())) for _ in range(outstanding)}
    while True:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
            pending.add(asyncio.ensure_future(worker.run_batch(next_batch())))


# --- one measurement ------------------------------------------------------------------------

def _measure(cmd: list[str], env: dict[str, str], cwd: str, port: int, warmup: float,
             window: float) -> dict[str, Any]:
    err = Path(cwd) / "stderr.txt"
    with open(err, "wb") as stderr:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True)
    try:
        start = _count(port)
        deadline = time.monotonic() + 180
        while _count(port) == start:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[3:6]} did not start: {err.read_text()[-800:]}")
            time.sleep(0.05)
        time.sleep(warmup)
        c0, cpu0, t0 = _count(port), tree_cpu(proc.pid), time.perf_counter()
        time.sleep(window)
        c1, cpu1, t1 = _count(port), tree_cpu(proc.pid), time.perf_counter()
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[3:6]} ended inside the window: {err.read_text()[-800:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    turns = c1 - c0
    parts, procs = _split(cpu0, cpu1, turns)
    total = sum(parts.values())
    return {"turns_s": turns / (t1 - t0), "cpu_us_turn": total, "core_share": total * turns / 1e6 / (t1 - t0),
            **{f"{p}_us": parts[p] for p in PARTS}, "processes": procs[:8]}


def _one(kind: str, port: int, in_flight: int, latency_s: float, warmup: float, window: float,
         pythonpath: str | None, quiet: bool, output: str = "") -> dict[str, Any]:
    samples = max(2, int((in_flight / latency_s) * (warmup + window + 30) / 2 / 1000) + 1)
    with tempfile.TemporaryDirectory(prefix="share-") as tmp:
        cfg = Path(tmp) / "config.toml"
        # `output` is more of the [output] table, the config's last.
        cfg.write_text(CONFIG.format(samples=samples, port=port, in_flight=in_flight, tmp=tmp) + output)
        env = dict(os.environ)
        env.pop("RAY_ADDRESS", None)
        env["PYTHONPATH"] = os.pathsep.join(x for x in (pythonpath, str(ROOT)) if x)
        if kind == "alone":
            cmd = ["taskset", "-c", "0", sys.executable, "-m", "bench.driver_share", "--alone", str(cfg)]
        else:
            cmd = ["taskset", "-c", "0", sys.executable, "-m", "collector", "run", str(cfg)]
            if quiet:
                cmd.append("--quiet")
        return _measure(cmd, env, tmp, port, warmup, window)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--in-flight", type=int, default=64)
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--warmup", type=float, default=4.0)
    p.add_argument("--window", type=float, default=8.0)
    p.add_argument("--quiet-too", action="store_true",
                   help="also `collector run --quiet` (no progress polling)")
    p.add_argument("--worker-writes", nargs="*", default=[], choices=["true", "false"],
                   help="also this tree with output.worker_writes set so")
    p.add_argument("--before", nargs="*", default=[], help="git revisions to measure beside this tree")
    p.add_argument("--alone", default=None, help="internal: run the worker alone on this config")
    args = p.parse_args(argv)
    if args.alone is not None:
        asyncio.run(_feed(args.alone))
        return {}
    rounds = args.rounds or (1 if args.quick else 3)
    if args.quick:
        args.warmup, args.window = 1.0, 2.0
    port = free_port()
    server = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-m", "bench.fastserver",
                               "--port", str(port), "--latency-ms", str(args.latency_ms)],
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    variants: list[tuple[str, str, str | None, bool, str]] = [("worker alone", "alone", None, False, ""),
                                                              ("collector run", "run", None, False, "")]
    if args.quiet_too:
        variants.append(("collector run --quiet", "run", None, True, ""))
    for value in args.worker_writes:
        variants.append((f"collector run, worker_writes = {value}", "run", None, False,
                         f"worker_writes = {value}\n"))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="share-before-") as before_dir:
        for rev in args.before:
            tree = Path(before_dir) / rev
            tree.mkdir()
            variants.append((f"collector run @ {rev}", "run", _extract(rev, str(tree)), False, ""))
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
                order = variants[r % len(variants):] + variants[:r % len(variants)]
                for name, kind, path, quiet, output in order:
                    row = {"variant": name, "round": r,
                           **_one(kind, port, args.in_flight, args.latency_ms / 1000, args.warmup,
                                  args.window, path, quiet, output)}
                    rows.append(row)
                    print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()
                           if k != "processes"}, flush=True)
                    for cmd, us in row["processes"][:6]:
                        print(f"    {us:8.1f} us/turn  {cmd}", flush=True)
        finally:
            server.terminate()
            server.wait(10)
    for row in rows:  # each run over the worker alone of its own round
        alone = next(a for a in rows if a["variant"] == "worker alone" and a["round"] == row["round"])
        row["x_alone"] = row["cpu_us_turn"] / alone["cpu_us_turn"]
    summary = []
    for name, *_ in variants:
        mine = [row for row in rows if row["variant"] == name]
        ratios = [m["x_alone"] for m in mine]
        rate = median([m["turns_s"] for m in mine])
        summary.append({"variant": name, "turns_s": rate,
                        "x_little": rate / (args.in_flight / args.latency_ms * 1000),
                        "cpu_us_turn": median([m["cpu_us_turn"] for m in mine]),
                        "x_alone": median(ratios), "x_alone_range": f"{min(ratios):.2f}-{max(ratios):.2f}",
                        **{f"{p}_us": median([m[f'{p}_us'] for m in mine]) for p in PARTS},
                        "core_share": median([m["core_share"] for m in mine])})
    for row in rows:
        del row["processes"]
    notes = [f"{args.in_flight} in flight, {args.latency_ms:g} ms, window {args.window:g} s after "
             f"{args.warmup:g} s; x_alone: CPU per turn over the worker alone's, same round"]
    return report(NAME, "The driver's share: collector run's process tree vs the worker alone", args,
                  rows, summary, notes)


if __name__ == "__main__":
    main()
