"""configs/openenv_demo.toml through the CLI on the simulator: an OpenEnv server started by the
collector's workers, episodes committed with typed stop reasons, no server left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from collector.cli import main
from collector.record.shards import read_shard
from collector.stop import StopReason
from collector.storage.manifest import committed_shard_paths

ROOT = Path(__file__).resolve().parents[2]


def test_openenv_demo_runs_end_to_end_through_the_cli(tmp_path: Path) -> None:
    """`collector run configs/openenv_demo.toml` commits every episode without an error (the
    workers start the example's OpenEnv server themselves), `collector check` passes, and no
    server process outlives the run."""
    run_dir = tmp_path / "run"
    marker = f"marker-{tmp_path.name}"  # an extra argument the example server ignores
    command = ["python", "-m", "openenv_guess.server", "{port}", marker]
    cli = [sys.executable, "-m", "collector.cli"]
    overrides = [
        f"output.path={run_dir}",
        "sweep.models=['sim-terse']",
        "sweep.budgets=[32, 256]",
        "env.options.num_tasks=4",
        f"env.options.server={json.dumps(command)}",
    ]
    run = subprocess.run(
        [*cli, "run", "configs/openenv_demo.toml", "--quiet", *(a for o in overrides for a in ("--set", o))],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    # `collector check` in this process: the run's processes are what is tested, not check's.
    assert main(["check", str(run_dir)]) == 0
    rows = [row for p in committed_shard_paths(run_dir) for row in read_shard(p).to_pylist()]
    assert len(rows) == 8
    assert all(StopReason(r["stop_reason"]) is not StopReason.ERROR for r in rows), [r["error"] for r in rows]
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert left.stdout == "", "an OpenEnv server outlived the run"
