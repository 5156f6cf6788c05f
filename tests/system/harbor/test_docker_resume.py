"""A Harbor run whose driver is SIGKILLed mid-episode leaves containers; resuming removes them,
including one whose creation the daemon finishes only after the resumed run's first sweep."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from collector.cli import main
from collector.config import load_config
from collector.config.identity import run_id
from collector.envs.harbor import RUN_LABEL, HarborEnvironment
from collector.record.shards import read_shard
from collector.storage.manifest import committed_shard_paths

REPO = Path(__file__).resolve().parents[3]

#: A `docker` that holds the first `docker run` it is given, as a daemon that has accepted a
#: create and not finished it: the create goes on in a session of its own (the driver's SIGKILL,
#: sent to its process group, does not reach it, as it does not reach the daemon) and runs the
#: real command only when the test opens the gate. Later `run`s hang without creating anything
#: (they die with the driver); every other command is the real docker's.
HOLDING_DOCKER = """#!/bin/sh
if [ "$1" = run ]; then
    if mkdir "{dir}/held" 2>/dev/null; then
        setsid sh -c 'cat "{dir}/gate" >/dev/null; "{real}" "$@" >/dev/null 2>&1; touch "{dir}/landed"' \\
            held "$@" </dev/null >/dev/null 2>&1 &
        touch "{dir}/in-flight"
    fi
    exec sleep 3600
fi
exec "{real}" "$@"
"""

def labelled(run: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={RUN_LABEL}={run}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def sigkill_on(child: subprocess.Popen[bytes], event: Callable[[], bool], what: str) -> None:
    """SIGKILL the run's process group once `event()` holds (`what` names the event); a guard of
    two minutes against a run that never gets there, never a measurement."""
    try:
        deadline = time.monotonic() + 120
        while not event():
            assert child.poll() is None, f"the run ended before {what}"
            assert time.monotonic() < deadline, f"no {what} within two minutes"
            time.sleep(0.05)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)


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
    # The event: a container of this run exists, an episode is in flight.
    sigkill_on(child, lambda: bool(labelled(run)), "a container of the run appeared")
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


def test_a_container_the_daemon_creates_after_the_resumed_runs_first_sweep_is_removed_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The killed driver's `docker run` is still in flight when the resumed run sweeps at start;
    its container lands after that sweep, mid-run, and the resumed run still ends with none."""
    out = tmp_path / "run"
    overrides = ["--set", f"output.path={out}", "--set", "name=harbor_late_create"]
    cfg = load_config(str(REPO / "configs" / "harbor_demo.toml"), [o for o in overrides if o != "--set"])
    run = run_id(cfg)
    real = shutil.which("docker")
    assert real is not None
    hold = tmp_path / "hold"
    (hold / "bin").mkdir(parents=True)
    os.mkfifo(hold / "gate")
    wrapper = hold / "bin" / "docker"
    wrapper.write_text(HOLDING_DOCKER.format(dir=hold, real=real))
    wrapper.chmod(0o755)
    child = subprocess.Popen(
        [sys.executable, "-m", "collector", "run", "configs/harbor_demo.toml", *overrides],
        cwd=REPO,
        env={**os.environ, "PATH": f"{hold / 'bin'}{os.pathsep}{os.environ['PATH']}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    # The event: a `docker run` is in the daemon's hands.
    sigkill_on(child, (hold / "in-flight").exists, "a `docker run` of the run was asked for")
    assert labelled(run) == [], "the held create landed early: the race is not the one under test"

    sweeps = 0
    sweep = HarborEnvironment.remove_leftovers

    async def late_create(self: HarborEnvironment, run_id: str) -> int:
        # After the resumed run's first sweep (it found nothing), the held create lands.
        nonlocal sweeps
        removed = await sweep(self, run_id)
        sweeps += 1
        if sweeps == 1:
            release_and_wait(hold)
            assert len(labelled(run)) == 1
        return removed

    monkeypatch.setattr(HarborEnvironment, "remove_leftovers", late_create)
    monkeypatch.chdir(REPO)
    assert main(["run", "configs/harbor_demo.toml", *overrides]) == 0
    assert sweeps >= 1
    assert labelled(run) == []
    ids = [
        i
        for p in committed_shard_paths(out)
        for i in read_shard(p, ["episode_id"]).column("episode_id").to_pylist()
    ]
    assert len(ids) == len(set(ids)) == 8


def release_and_wait(hold: Path) -> None:
    """Open the held create's gate (once its reader waits on it) and wait until it has landed."""
    deadline = time.monotonic() + 120
    while True:
        try:
            fd = os.open(hold / "gate", os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:  # ENXIO: the held create has not opened the gate yet
            if exc.errno != errno.ENXIO:
                raise
            assert time.monotonic() < deadline, "the held create never waited on its gate"
            time.sleep(0.05)
    os.close(fd)  # its reader sees the end of the file: the create goes on
    while not (hold / "landed").exists():
        assert time.monotonic() < deadline, "the held create did not land"
        time.sleep(0.05)
