"""A toy GRPO-style trainer that learns from a sweep while it is being collected (issue 27).

    python examples/follow_trainer.py [--dir DIR] [--tasks N] [--samples K]

It writes a small config for the simulated provider, starts `collector run` on it in a
subprocess, and follows the run with `collector.analysis.follow.follow(groups="complete")`:
each step gets only whole groups (every sample of a task, model and budget), computes
group-relative advantages (reward minus the group's mean, the GRPO baseline), and prints one
line per step. The cursor of each step is kept in DIR/cursor, so a trainer killed and started
again resumes where it stopped (`--resume`), without seeing a sample twice.

The follower never slows the collection: it only reads what is committed; the run finishes
at its own pace and the loop ends once the run's writer is gone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from collector.analysis.follow import follow

CONFIG = """
name = "follow-trainer"
samples_per_task = {samples}
[sweep]
models = ["sim-slow"]
budgets = [64, 256]
[env]
name = "arithmetic"
tasks = {tasks}
[ray]
workers = 1
episodes_in_flight = 4
batch_size = 4
cpus_per_worker = 0.5
[output]
path = "{run_dir}"
rows_per_shard = 8
commit_interval_s = 0.3
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="run and cursor go here (default: a temp dir)")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4, help="samples per task: the group size")
    parser.add_argument("--resume", action="store_true", help="follow from DIR/cursor (no new collection)")
    args = parser.parse_args(argv)
    work = args.dir or Path(tempfile.mkdtemp(prefix="follow-trainer-"))
    work.mkdir(parents=True, exist_ok=True)
    run_dir, cursor_file = work / "run", work / "cursor"

    collection = None
    if not args.resume:
        config = work / "config.toml"
        config.write_text(CONFIG.format(samples=args.samples, tasks=args.tasks, run_dir=run_dir))
        # The collector in its own process, as on a cluster: nothing here waits on it but the end.
        collection = subprocess.Popen([sys.executable, "-m", "collector", "run", str(config), "--quiet"],
                                      stdout=subprocess.DEVNULL)
        _wait_for_run(run_dir, collection)

    since = cursor_file.read_text().strip() if args.resume and cursor_file.exists() else None
    step = 0
    for batch in follow(run_dir, since=since, groups="complete", poll_s=0.2):
        rewards = batch.table.column("reward").to_pylist()
        samples = batch.table.column("sample").to_pylist()
        # A released group's rows come together, samples in order: one group every `size` rows.
        size = len(rewards) // batch.groups
        advantages = []
        for g in range(batch.groups):
            group = rewards[g * size:(g + 1) * size]
            assert samples[g * size:(g + 1) * size] == list(range(size)), "a partial group"
            baseline = statistics.fmean(group)
            advantages.extend(r - baseline for r in group)
        step += 1
        spread = statistics.pstdev(advantages) if len(advantages) > 1 else 0.0
        print(f"step {step}: {batch.groups} group(s) of {size}, {len(rewards)} samples, "
              f"mean reward {statistics.fmean(rewards):.3f}, advantage spread {spread:.3f}, "
              f"errors {batch.errors}, commit {batch.seq}", flush=True)
        cursor_file.write_text(batch.cursor)  # after the update: a restart resumes after this step
    if collection is not None and collection.wait() != 0:
        print(f"collector run exited with {collection.returncode}", file=sys.stderr)
        return 1
    print(f"done: {step} step(s); run in {run_dir}")
    return 0


def _wait_for_run(run_dir: Path, collection: subprocess.Popen[bytes]) -> None:
    """Until `collector run` has created the run (its manifest), or has failed."""
    import time

    while not (run_dir / ".collector" / "manifest.json").exists():
        if collection.poll() is not None:
            raise SystemExit(f"collector run exited with {collection.returncode} before creating {run_dir}")
        time.sleep(0.1)


if __name__ == "__main__":
    os.environ.pop("RAY_ADDRESS", None)  # a local cluster for the collector, never someone's
    sys.exit(main())
