"""The embedded cluster of a single-machine `collector run` (`collector.run.cluster`,
`EMBEDDED_SYSTEM_CONFIG`) runs what the run needs and not Ray's extras: no prestarted idle
worker polling beside the run's own, while the run still works and reports progress.

What is checked is the process tree (psutil) once the run has committed a shard, and the
progress lines the run wrote to its stderr (a pipe: a full line every few seconds).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from collector.errors import OutputError
from collector.storage.manifest import MANIFEST, read_manifest
from tests.checking import committed_ids
from tests.system.processes import SLOW, WAIT_GUARD_S, user_env


def commands(pid: int) -> list[str]:
    """The command line of `pid`'s every descendant (Ray names its workers there: `ray::...`)."""
    found = []
    for proc in psutil.Process(pid).children(recursive=True):
        try:
            found.append(" ".join(proc.cmdline()))
        except psutil.Error:
            continue  # ended meanwhile
    return found


@pytest.mark.timeout(600)
def test_the_embedded_cluster_starts_no_idle_worker_and_the_run_reports_progress(tmp_path: Path) -> None:
    config, run_dir = tmp_path / "slow.toml", tmp_path / "run"
    config.write_text(SLOW.format(run_dir=run_dir))
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "collector", "run", str(config)], env=user_env(),
                                   cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=stderr)
    try:
        guard = time.monotonic() + WAIT_GUARD_S
        while True:  # the event: a committed shard (the worker is up and running episodes)
            assert process.poll() is None, stderr_path.read_text()
            assert time.monotonic() < guard, "no shard committed"
            try:
                if (run_dir / MANIFEST).exists() and read_manifest(run_dir)["shards"]:
                    break
            except (OSError, ValueError, KeyError, OutputError):
                pass  # not written yet, or being replaced
            time.sleep(0.05)
        tree = commands(process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=WAIT_GUARD_S)
    err = stderr_path.read_text()
    assert [c for c in tree if c.startswith("ray::_WorkerActor")], tree
    assert [c for c in tree if c.startswith("ray::IDLE")] == [], tree
    assert any(name in c for c in tree for name in ("raylet", "gcs_server")), tree
    assert process.returncode == 143, err
    lines = [line for line in err.splitlines() if "committed)" in line]
    assert lines, err
    assert "ep/s" in lines[-1], err
    assert set(committed_ids(run_dir).values()) == {1}
