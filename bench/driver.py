"""The driver's cost per episode: worker-side writes vs driver-side (issue 19, item 2).

    .venv/bin/python -m bench.driver [--episodes 480] [--quick]

The real job (`run_job`: embedded Ray cluster, 2 worker actors, the simulator's `bench-zero`
model in its own process) runs the same sweep with ~1 KB and ~200 KB episodes (the
arithmetic task with random words appended to its prompt: the transcript, and so the record,
grows with it), in 1 and 8 (model, budget) cells, once with the driver writing the shards
(`output.worker_writes = false`) and once with the workers writing them (`true`, the run
dir being a local directory every worker sees). Each configuration runs in a fresh process,
so that one run's heap never hides another's peak.

- `driver_cpu_ms_per_ep`: CPU of the driver process (every thread: Ray's core worker
  receiving batches, unpickling, buffering, converting, writing and committing) from the
  moment the workers are ready to the end of the final commit, per committed episode. It
  includes the driver's idle polling over the run's wall time, the same in both modes.
- `driver_growth_mb`: the driver's peak RSS (sampled every 50 ms) above its RSS when the
  workers were ready; `driver_peak_mb` the peak itself.
- `episode_kb`: the pickled size of one committed episode (what crosses Ray driver-side);
  `stored_kb`: shard bytes per episode (zstd).

Output settings are the defaults (rows_per_shard 512, commit_interval_s 30, max_buffered_rows
4,096): a driver-side run of fewer episodes than that holds all of them until its final
commit, which is what it does at the start of any long run of large episodes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, SimProcess, parser, report
from collector.envs.arithmetic import ArithmeticEnv
from collector.envs.base import Task

NAME = "driver"
WORDS = ("alpha", "ledger", "turbine", "quartz", "meadow", "signal", "harbor", "cobalt", "vivid",
         "lantern", "orbit", "saffron", "delta", "timber", "falcon", "prism", "ember", "summit")


class PaddedArithmetic(ArithmeticEnv):
    """The arithmetic tasks with `pad_kb` KB of random words after the question (the simulator
    still finds the question; the episode's transcript carries the words)."""

    name = "padded_arithmetic"

    def __init__(self, pad_kb: int = 0, num_tasks: int = 100, seed: int = 0) -> None:
        super().__init__(num_tasks, seed)
        rng = random.Random(seed)
        self._padded = []
        for task in super().tasks():
            words: list[str] = []
            size = 0
            while size < pad_kb * 1024:
                words.append(rng.choice(WORDS))
                size += len(words[-1]) + 1
            prompt = f"{task.prompt}\n\n{' '.join(words)}" if words else task.prompt
            self._padded.append(dataclasses.replace(task, prompt=prompt))

    def tasks(self) -> Sequence[Task]:
        return self._padded


def _config(root: str, out: str, episodes: int, cells: int, pad_kb: int, worker_writes: bool) -> Any:
    from collector.config import config_from_dict

    budgets = [256 + i for i in range(cells)]
    tasks = 60
    return config_from_dict({
        "name": f"bench-driver-{pad_kb}-{cells}", "seed": 0,
        "samples_per_task": max(1, episodes // (tasks * cells)),
        "provider": {"kind": "chat", "base_url": root + "/v1"},
        "sweep": {"models": ["bench-zero"], "budgets": budgets},
        "env": {"name": "bench.driver:PaddedArithmetic", "python_path": [str(ROOT)],
                "options": {"pad_kb": pad_kb, "num_tasks": tasks}},
        "ray": {"workers": 2, "episodes_in_flight": 16},
        "output": {"path": out, "format": "arrow", "worker_writes": worker_writes},
    })


def _measure_one(spec: dict[str, Any]) -> dict[str, Any]:
    """One configuration, in this (fresh) process: run the job, return its figures."""
    import psutil

    from collector.record.shards import episodes_from_table, read_shard
    from collector.run import job
    from collector.run.cluster import RayPool
    from collector.storage.manifest import committed_shard_paths

    me = psutil.Process(os.getpid())
    marks: dict[str, float] = {}
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], me.memory_info().rss)
            time.sleep(0.05)

    class MarkedPool(RayPool):
        """The real pool, marking when the workers get their first batch (they are all ready
        then) and when the first is closed (after the final commit)."""

        def run(self, actor: Any, items: list[Any], write: bool) -> Any:
            if "cpu0" not in marks:
                marks["cpu0"], marks["rss0"] = time.process_time(), me.memory_info().rss
                peak[0] = int(marks["rss0"])
            return super().run(actor, items, write)

        def close(self, actor: Any, started: bool) -> None:
            marks.setdefault("cpu1", time.process_time())
            super().close(actor, started)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with tempfile.TemporaryDirectory(prefix="bench-driver-") as tmp:
        out = str(Path(tmp) / "run")
        cfg = _config(spec["root"], out, spec["episodes"], spec["cells"], spec["pad_kb"],
                      spec["worker_writes"])
        t0 = time.perf_counter()
        result = job.run_job(cfg, show_progress=False, pool=MarkedPool())
        wall = time.perf_counter() - t0
        stop.set()
        sampler.join()
        shards = committed_shard_paths(out)
        first = episodes_from_table(read_shard(shards[0]))[:20]
        episode_kb = sum(len(pickle.dumps(e)) for e in first) / len(first) / 1024
        stored_kb = sum(Path(p).stat().st_size for p in shards) / max(1, result.committed) / 1024
    return {
        "episode_kb": episode_kb, "stored_kb": stored_kb, "cells": spec["cells"],
        "writes": "worker" if spec["worker_writes"] else "driver",
        "episodes": result.committed, "seconds": wall,
        "driver_cpu_ms_per_ep": (marks["cpu1"] - marks["cpu0"]) * 1000 / max(1, result.committed),
        "driver_growth_mb": (peak[0] - marks["rss0"]) / 2**20,
        "driver_peak_mb": peak[0] / 2**20,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=480)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one configuration
    args = p.parse_args(argv)
    if args.one is not None:
        print(json.dumps(_measure_one(json.loads(args.one))))
        return {}
    sizes, cells, writers = ([0, 100], [1, 8], (False, True)) if not args.quick else ([0], [1], (True,))
    if args.quick:  # one configuration in one child: each starts a Ray node of its own
        args.episodes = 60
    args.rounds = 1
    rows = []
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with SimProcess() as sim:
        for pad_kb in sizes:
            for n_cells in cells:
                for worker_writes in writers:
                    spec = {"root": sim.root, "episodes": args.episodes, "cells": n_cells,
                            "pad_kb": pad_kb, "worker_writes": worker_writes}
                    proc = subprocess.run([sys.executable, "-m", "bench.driver", "--one", json.dumps(spec)],
                                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)
                    if proc.returncode != 0:
                        raise RuntimeError(f"bench.driver --one {spec} failed: {proc.stderr[-2000:]}")
                    row = json.loads(proc.stdout.strip().splitlines()[-1])
                    rows.append(row)
                    print(f"  {row['episode_kb']:.0f} KB x {n_cells} cell(s), {row['writes']}-side: "
                          f"{row['driver_cpu_ms_per_ep']:.2f} ms/episode, +{row['driver_growth_mb']:.0f} MB",
                          flush=True)
    notes = ["driver_cpu_ms_per_ep: the driver process's CPU (all threads) from workers ready to the "
             "final commit, per committed episode; driver_growth_mb: its peak RSS above its RSS then",
             "2 workers x 16 in flight, batch_size 32, zero-latency simulator in its own process, "
             "output defaults; each configuration in a fresh process"]
    return report(NAME, "Driver CPU and memory per episode: worker-side vs driver-side writes",
                  args, rows, rows, notes)


if __name__ == "__main__":
    main()
