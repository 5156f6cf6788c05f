"""configs/mcp_demo.toml through the CLI on the simulator: MCP tools end to end, `collector
check` passing, the server's own log joining `executed_tool_calls`, Ray's logs where
`ray.temp_dir` says."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from collector.cli import main
from collector.record.shards import read_shard
from collector.storage.manifest import committed_shard_paths

ROOT = Path(__file__).resolve().parents[3]



def test_mcp_demo_runs_end_to_end_through_the_cli(tmp_path: Path) -> None:
    """The MCP demo collects on the simulator with the server's tools actually called, passes
    `collector check`, its server's log names exactly the stored (episode, call) pairs, and the
    run's Ray session logs are under `ray.temp_dir`."""
    run_dir = tmp_path / "run"
    server_log = tmp_path / "warehouse.log"
    ray_dir = tempfile.mkdtemp(prefix="rl", dir="/tmp")  # short: Ray's socket paths live under it
    cli = [sys.executable, "-m", "collector.cli"]
    overrides = [
        f"output.path={run_dir}",
        f"ray.temp_dir={ray_dir}",
        # sim-perfect writes no wrong arguments (sim-terse does, 5% of calls, by seed): every
        # reward then says the answer came from the server's tools.
        "sweep.models=['sim-perfect']",
        "sweep.budgets=[256]",
        "ray.workers=1",  # five episodes: a second worker (and MCP server) would only add start-up
        f"env.options.env={{WAREHOUSE_LOG={json.dumps(str(server_log))}}}",
    ]
    try:
        run = subprocess.run(
            [*cli, "run", "configs/mcp_demo.toml", "--quiet", *(a for o in overrides for a in ("--set", o))],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=280,
            env={**os.environ},
        )
        assert run.returncode == 0, run.stderr[-2000:]
        # `collector check` in this process: the run's processes are what is tested, not check's.
        assert main(["check", str(run_dir)]) == 0
        assert any(Path(ray_dir).glob("session_*/logs/*"))
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    rows = [row for p in committed_shard_paths(run_dir) for row in read_shard(p).to_pylist()]
    assert {r["task_id"] for r in rows} == {"status-1001", "status-2002", "status-9999", "sum-1", "sum-2"}
    assert all(r["stop_reason"] == "done" and r["num_tool_calls"] >= 1 for r in rows)
    assert sum(r["reward"] for r in rows) == len(rows)  # every answer came from the server's tools
    stored = {(r["episode_id"], c["call_id"]) for r in rows for c in r["executed_tool_calls"]}
    logged = set()
    for line in server_log.read_text().splitlines():
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        logged.add((fields["episode"], fields["call"]))
    assert logged == stored
