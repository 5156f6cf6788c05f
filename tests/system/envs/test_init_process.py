"""`collector init` then `collector run` from the parent directory, as processes on the session's cluster.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_init_then_run_from_the_parent_directory(tmp_path: Path, ray_cluster: str) -> None:
    """`collector init proj && collector run proj/config.toml` from the parent runs the starter
    (its `python_path = ["."]` is the project's directory); the run lands in ./runs/starter."""
    import subprocess

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "collector.cli", *argv], cwd=tmp_path, text=True,
                              capture_output=True, timeout=300, check=False)

    assert cli("init", "proj").returncode == 0
    run = cli("run", "proj/config.toml", "--address", ray_cluster, "--quiet", "--set", "env.tasks=2",
              "--set", "ray.workers=1")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "sim-sloppy" in run.stdout
    assert (tmp_path / "runs" / "starter" / ".collector" / "manifest.json").is_file()
