"""configs/trl_demo.toml through the CLI on the simulator: a TRL environment class collected
end to end with Ray, its tools called, cut turns typed, `collector stats` reading the run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from collector.record.shards import read_shard
from collector.storage.manifest import committed_shard_paths

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.ray]


def test_trl_demo_runs_end_to_end_through_the_cli(tmp_path: Path) -> None:
    """The TRL demo config runs as written: the class's tools are called, the reward function
    scores the episodes it should, the 24-token budget ends episodes as `length` (never `error`),
    and `collector stats` prints a row per model and budget."""
    run_dir = tmp_path / "run"
    ray_dir = tempfile.mkdtemp(prefix="rl", dir="/tmp")  # short: Ray's socket paths live under it
    cli = [sys.executable, "-m", "collector.cli"]
    overrides = [f"output.path={run_dir}", f"ray.temp_dir={ray_dir}"]
    try:
        run = subprocess.run(
            [*cli, "run", "configs/trl_demo.toml", "--quiet", *(a for o in overrides for a in ("--set", o))],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=280,
            env={**os.environ},
        )
        assert run.returncode == 0, run.stderr[-2000:]
        stats = subprocess.run([*cli, "stats", str(run_dir)], cwd=ROOT, capture_output=True, text=True)
        assert stats.returncode == 0, stats.stderr
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    rows = [row for p in committed_shard_paths(run_dir) for row in read_shard(p).to_pylist()]
    assert len(rows) == 48
    reasons = {r["stop_reason"] for r in rows}
    assert "error" not in reasons
    assert {"done", "length"} <= reasons
    assert all(r["env"] == "trl:trl_shop.env:ShopEnv" for r in rows)
    done = [r for r in rows if r["stop_reason"] == "done" and r["task_id"] == "reserve-a17"]
    assert done
    assert any(r["reward"] == 1.0 for r in done)
    executed = {c["name"] for r in rows for c in r["executed_tool_calls"]}
    assert executed == {"check_stock", "reserve"}
    for model in ("sim-terse", "sim-sloppy"):
        for budget in (24, 256):
            assert any(line.split()[:2] == [model, str(budget)] for line in stats.stdout.splitlines()), (
                stats.stdout
            )
