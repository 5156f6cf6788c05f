"""A Harbor run whose driver is SIGKILLed mid-episode leaves containers; resuming removes them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collector.cli import main
from collector.config import load_config
from collector.config.identity import run_id
from collector.envs.harbor import RUN_LABEL
from collector.record.shards import read_shard
from collector.storage.manifest import committed_shard_paths

REPO = Path(__file__).resolve().parents[3]

def labelled(run: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={RUN_LABEL}={run}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def test_a_resumed_run_removes_what_a_sigkilled_driver_left_and_commits_every_episode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL while a container runs leaves it; the resumed run removes it and commits all 8 episodes."""
    out = tmp_path / "run"
    overrides = ["--set", f"output.path={out}", "--set", "name=harbor_kill"]
    cfg = load_config(str(REPO / "configs" / "harbor_demo.toml"), [o for o in overrides if o != "--set"])
    run = run_id(cfg)
    child = subprocess.Popen(
        [sys.executable, "-m", "collector", "run", "configs/harbor_demo.toml", *overrides],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not labelled(run):  # the event: a container of this run exists, an episode is in flight
            assert child.poll() is None, "the run ended before any container was seen"
            assert time.monotonic() < deadline, "no container of the run appeared"
            time.sleep(0.05)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert labelled(run), "the killed run left no container: nothing to clean up"
    monkeypatch.chdir(REPO)
    assert main(["run", "configs/harbor_demo.toml", *overrides]) == 0
    assert labelled(run) == []
    ids = [
        i
        for p in committed_shard_paths(out)
        for i in read_shard(p, ["episode_id"]).column("episode_id").to_pylist()
    ]
    assert len(ids) == len(set(ids)) == 8
