"""When does a GRPO consumer get its first complete group? `collector follow --groups complete`
against a live run, by planning order and commit cadence.

    .venv/bin/python -m bench.follow_groups [--tasks 100] [--samples 4]

Each setting runs the same in-process sweep on the simulator (`sim-slow`, ~50 ms a reply)
with a follower started before the run (it waits for it, `wait_s`), and prints the second
of the run at which the first complete group reached the follower, against the run's length:
sample-major with the default 30 s commits (the old behaviour), sample-major with 2 s
commits, group-major with 2 s commits.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from collector.analysis.follow import Follower
from collector.config import RunConfig
from collector.run.job import run_job

SETTINGS = (("sample_major", 30.0), ("sample_major", 2.0), ("group_major", 2.0))


def measure(root: Path, order: str, commit_s: float, tasks: int, samples: int) -> tuple[float, float, int]:
    """(seconds to the first complete group, seconds of the run, groups delivered)."""
    run_dir = root / f"{order}-{commit_s:g}"
    cfg = RunConfig.model_validate({
        "name": "follow-bench", "samples_per_task": samples,
        "sweep": {"models": ["sim-slow"], "budgets": [64, 256], "order": order},
        "env": {"name": "arithmetic", "tasks": tasks},
        "ray": {"pool": "in_process", "workers": 2, "episodes_in_flight": 16, "batch_size": 8},
        "output": {"path": str(run_dir), "commit_interval_s": commit_s},
    })
    first: list[float] = []
    groups = [0]
    start = [0.0]

    def consume() -> None:
        for batch in Follower(run_dir, groups="complete", poll_s=0.1, wait_s=120.0):
            if not first:
                first.append(time.monotonic())
            groups[0] += batch.groups

    consumer = threading.Thread(target=consume)
    consumer.start()
    start[0] = time.monotonic()
    run_job(cfg, show_progress=False)
    end = time.monotonic()
    consumer.join()
    return first[0] - start[0], end - start[0], groups[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--samples", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for order, commit_s in SETTINGS:
            x, y, n = measure(Path(tmp), order, commit_s, args.tasks, args.samples)
            print(f"{order:<13} commit_interval_s={commit_s:<4g} first complete group after {x:5.1f} s "
                  f"of a {y:5.1f} s run ({n} groups)", flush=True)


if __name__ == "__main__":
    main()
