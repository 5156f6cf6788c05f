"""A small sweep through each worker pool: `collector run` on Ray against `collector run --in-process`.

    .venv/bin/python -m bench.pools                    # 4 and 64 episodes, 3 interleaved rounds

The question a user asks before checking a new environment: how long does a small run take?
Each variant is a real `collector run` process (a cold start, as a person runs it: imports, the
simulator, the workers, the commit, the table), on the same config in a fresh run directory:
arithmetic tasks on `sim-terse`, two workers. `ray` starts the embedded Ray cluster;
`in_process` runs the same workers on threads of the command's process. Wall is the command's
elapsed time; CPU is user + system of the command and every process it started (RUSAGE_CHILDREN
around it). Variants are interleaved and the order is reversed every round; medians are reported
with `x_ray`, the variant's wall over Ray's in the same sizes.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, median, parser, report

CONFIG = """
name = "pools"
[sweep]
models = ["sim-terse"]
budgets = [128]
[env]
name = "arithmetic"
tasks = {tasks}
[ray]
pool = "{pool}"
workers = 2
cpus_per_worker = 0.5
[output]
path = "{run_dir}"
"""


def one_run(pool: str, tasks: int, tmp: Path) -> dict[str, Any]:
    run_dir = tmp / f"{pool}-{tasks}-{time.monotonic_ns()}"
    config = tmp / f"{run_dir.name}.toml"
    config.write_text(CONFIG.format(tasks=tasks, pool=pool, run_dir=run_dir))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "collector", "run", str(config), "--quiet"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"bench.pools: collector run ({pool}) failed: {proc.stderr[-2000:]}")
    assert f"{tasks}/{tasks} episodes committed" in proc.stderr, proc.stderr
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"pool": pool, "episodes": tasks, "wall_s": wall, "cpu_s": cpu}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--sizes", default="4,64", help="episodes per run, comma-separated")
    args = p.parse_args(argv)
    sizes = [4] if args.quick else [int(s) for s in args.sizes.split(",")]
    rounds = args.rounds or (1 if args.quick else 3)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-pools-") as tmp:
        for r in range(rounds):
            order = ["ray", "in_process"] if r % 2 == 0 else ["in_process", "ray"]
            for size in sizes:
                for pool in order:
                    rows.append({"round": r, **one_run(pool, size, Path(tmp))})
    summary = []
    for size in sizes:
        ray_wall = median([row["wall_s"] for row in rows if row["episodes"] == size and row["pool"] == "ray"])
        for pool in ("ray", "in_process"):
            mine = [row for row in rows if row["episodes"] == size and row["pool"] == pool]
            wall = median([row["wall_s"] for row in mine])
            summary.append({"pool": pool, "episodes": size, "wall_s": wall,
                            "cpu_s": median([row["cpu_s"] for row in mine]), "x_ray": wall / ray_wall})
    return report("pools", "collector run: Ray pool vs in-process pool (medians)", args, rows, summary)


if __name__ == "__main__":
    main()
