"""configs/harness_openai.toml as docs/harnesses.md shows it: `collector run` on Ray, then `check`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from collector.cli import main
from collector.record.shards import read_shard
from collector.storage.manifest import committed_shard_paths

ROOT = Path(__file__).resolve().parents[3]


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
    assert len(reasons) == 8 * 2 * 3
    assert {"done", "length"} <= set(reasons)
    assert main(["check", str(run)]) == 0
