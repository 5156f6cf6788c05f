"""Memory: peak RSS of the driver and of each worker as a run grows 10x.

Issue 6, item 1e. The real job (`collector.run.job.run_job`: Ray driver, worker actors, shard
commits) runs the same sweep at `--episodes` and at 10x that, against the simulator in its
own process (`bench-zero`, zero latency) so that the driver's memory is the driver's alone.
A sampler thread reads the RSS of this process (the driver) and of every Ray worker
process hosting the collector's actor (`psutil`, every 100 ms) and keeps each one's peak.
Ray is started once and shared by both sizes, so both pay the same start-up.

Target: flat, i.e. the peaks of the 10x run within a small margin of the 1x run's. The
driver holds at most `rows_per_shard` episodes (or 5 s worth) before a commit, and each
worker holds only its outstanding batches, so neither should grow with the run.

    .venv/bin/python -m bench.memory [--episodes 1000]
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from bench.common import SimProcess, parser, report
from collector.config import config_from_dict

NAME = "memory"


class _Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop_flag = threading.Event()
        self.driver_peak = 0
        self.worker_peaks: dict[int, int] = {}
        self.me = psutil.Process(os.getpid())

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.driver_peak = max(self.driver_peak, self.me.memory_info().rss)
            for proc in psutil.process_iter(["pid", "cmdline"]):
                try:
                    cmd = " ".join(proc.info["cmdline"] or [])
                    if "_WorkerActor" in cmd or "ray::_WorkerActor" in proc.name():
                        rss = proc.memory_info().rss
                        self.worker_peaks[proc.pid] = max(self.worker_peaks.get(proc.pid, 0), rss)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            time.sleep(0.1)


def _config(root: str, episodes: int, out: str, workers: int, in_flight: int) -> Any:
    tasks = min(120, episodes)  # support_desk's tasks, sampled as often as the size asks
    return config_from_dict({
        "name": f"bench-memory-{episodes}", "seed": 0, "samples_per_task": max(1, episodes // tasks),
        "provider": {"kind": "chat", "base_url": root + "/v1"},
        "sweep": {"models": ["bench-zero"], "budgets": [256]},
        "env": {"name": "support_desk", "options": {"num_tasks": tasks}},
        "loop": {"max_steps": 6},
        "ray": {"workers": workers, "episodes_in_flight": in_flight},
        "output": {"path": out, "format": "arrow"},
    })


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=1200)
    p.add_argument("--growth", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--in-flight", type=int, default=64)
    args = p.parse_args(argv)
    if args.quick:
        args.episodes, args.growth, args.workers, args.in_flight = 40, 2, 1, 8
    args.rounds = 1
    import ray

    from collector.run.cluster import OBJECT_STORE_BYTES
    from collector.run.job import run_job

    rows = []
    with SimProcess() as sim, tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES,
                 logging_level=logging.WARNING, _temp_dir=str(Path(tmp) / "ray"))
        try:
            for size in (args.episodes, args.episodes * args.growth):
                cfg = _config(sim.root, size, str(Path(tmp) / f"run-{size}"), args.workers, args.in_flight)
                sampler = _Sampler()
                driver_before = sampler.me.memory_info().rss
                sampler.start()
                t0 = time.perf_counter()
                result = run_job(cfg, show_progress=False)
                wall = time.perf_counter() - t0
                sampler.stop_flag.set()
                sampler.join()
                peaks = sorted(sampler.worker_peaks.values())
                rows.append({"episodes": result.committed, "seconds": wall,
                             "driver_rss_before_mb": driver_before / 2**20,
                             "driver_peak_mb": sampler.driver_peak / 2**20,
                             "driver_growth_mb": (sampler.driver_peak - driver_before) / 2**20,
                             "worker_peak_mb_max": (peaks[-1] / 2**20) if peaks else float("nan"),
                             "workers_seen": len(peaks)})
                print(f"  {result.committed} episodes in {wall:.1f} s", flush=True)
        finally:
            ray.shutdown()
    small, big = rows[0], rows[-1]
    summary = [*rows, {"episodes": f"x{args.growth}",
                       "driver_peak_mb": big["driver_peak_mb"] / small["driver_peak_mb"],
                       "worker_peak_mb_max": big["worker_peak_mb_max"] / small["worker_peak_mb_max"]}]
    notes = [f"last row: ratio of peaks, {args.growth}x run over 1x run (target: flat, ~1.0)",
             f"{args.workers} workers x {args.in_flight} in flight, "
             "zero-latency simulator in its own process"]
    return report(NAME, "Peak RSS as a run grows", args, rows, summary, notes)


if __name__ == "__main__":
    main()
