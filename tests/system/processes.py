"""What the system tier's tests share: how a user's process is started, and a sweep slow enough to
be signalled or killed while it is provably in flight."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import psutil

from collector.errors import OutputError
from collector.storage.manifest import MANIFEST, read_manifest

REPO = Path(__file__).resolve().parents[2]

#: A generous guard against a hung test, never a measurement.
WAIT_GUARD_S = 240.0

#: sim-slow answers in about 50 ms: 300 episodes take over ten seconds at 4 in flight, and the
#: first shard (4 rows) is committed within a second of the workers starting.
SLOW = """
name = "signalled"
[sweep]
models = ["sim-slow"]
budgets = [64, 128, 256]
[env]
name = "arithmetic"
tasks = 100
[ray]
workers = 1
episodes_in_flight = 4
batch_size = 4
cpus_per_worker = 0.5
[output]
path = "{run_dir}"
rows_per_shard = 4
commit_interval_s = 0.5
"""


def user_env() -> dict[str, str]:
    """This environment without the variables the test session sets for its own Ray cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def start_and_wait_for_a_commit(
    config: Path, run_dir: Path, *options: str, quiet: bool = True, stderr: IO[str] | int = subprocess.PIPE
) -> subprocess.Popen[str]:
    """Start `collector run` (with `options`, e.g. `--in-process`; `--quiet` unless `quiet` is
    False, its stderr to `stderr`) and return once its manifest names a shard (episodes are in flight)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "collector", "run", str(config), *(["--quiet"] if quiet else []), *options],
        env=user_env(), cwd=config.parent, text=True, stdout=subprocess.PIPE, stderr=stderr,
    )
    guard = time.monotonic() + WAIT_GUARD_S
    manifest = run_dir / MANIFEST
    while time.monotonic() < guard:
        if process.poll() is not None:
            raise AssertionError(f"the run ended before its first commit: {process.communicate()}")
        try:
            # Through the commit log: during a run the base manifest.json lists only what
            # was compacted, the records after it the rest.
            if manifest.exists() and read_manifest(run_dir)["shards"]:
                return process
        except (OSError, ValueError, KeyError, OutputError):
            pass  # not written yet, or being replaced
        time.sleep(0.05)
    process.kill()
    raise AssertionError("no shard committed")


#: The addresses a socket may listen on and stay private to this machine.
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def listening(pid: int) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every listening inet socket of `pid` and its descendants."""
    root = psutil.Process(pid)
    found = []
    for proc in [root, *root.children(recursive=True)]:
        try:
            name = proc.name()
            found += [(name, c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                      if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            continue  # a worker that ended meanwhile listens nowhere
    return found
