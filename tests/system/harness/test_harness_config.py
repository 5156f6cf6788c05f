"""configs/harness_openai.toml as docs/harnesses.md shows it: `collector run` on Ray, then `check`.

The only harness run on a Ray worker (the worker's interpreter as `{python}`, the harness's
PYTHONPATH from the config's directory), so it stays on Ray; it runs the config's first task
(`env.tasks=1`) of eight: every cell of the sweep still runs, and the assertion (every
episode a committed row, both a finished and a cut episode, `check` clean) needs no more.
The outcome is fixed: the run id hashes the config as written (the output path and the task
count are not part of it), so its episode seeds are the same every run; sim-hidden-cut at 40
is the cut one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from collector.cli import main
from collector.record.shards import read_shard
from collector.storage.manifest import committed_shard_paths

ROOT = Path(__file__).resolve().parents[3]
TASKS = 1


def test_the_documented_harness_config_runs_and_its_run_checks_clean(tmp_path: Path) -> None:
    """The docs' harness config runs as written; every episode is a committed row; `check` is clean."""
    run = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "collector",
            "run",
            "configs/harness_openai.toml",
            "--set",
            f"output.path={run}",
            "--set",
            f"env.tasks={TASKS}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    reasons = []
    for path in committed_shard_paths(run):
        reasons += read_shard(path, columns=["stop_reason"]).column("stop_reason").to_pylist()
    assert len(reasons) == TASKS * 2 * 3  # models x budgets
    assert {"done", "length"} <= set(reasons)
    assert main(["check", str(run)]) == 0
