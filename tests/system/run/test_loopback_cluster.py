"""The embedded cluster of a single-machine `collector run` listens on loopback only
(`collector.run.cluster`): its GCS, raylet, agents, workers and the driver itself.

What is checked is the sockets, not an argument (Ray rewrote a loopback node address to the
machine's own): every listening socket of the driver's process tree, read with psutil once
the run has committed a shard (the workers are up and running episodes).
"""

from __future__ import annotations

import signal
from pathlib import Path

import psutil
import pytest

from tests.checking import committed_ids
from tests.system.processes import SLOW, WAIT_GUARD_S, start_and_wait_for_a_commit

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


@pytest.mark.timeout(600)
def test_the_embedded_cluster_listens_on_loopback_only(tmp_path: Path) -> None:
    """Mid-run, every socket the run's processes listen on is a loopback one (there are many:
    GCS, raylet, agents, the worker, the driver); the run then ends as usual on SIGTERM."""
    config, run_dir = tmp_path / "slow.toml", tmp_path / "run"
    config.write_text(SLOW.format(run_dir=run_dir))
    process = start_and_wait_for_a_commit(config, run_dir)
    try:
        sockets = listening(process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=WAIT_GUARD_S)
    names = {name for name, _, _ in sockets}
    assert {"gcs_server", "raylet"} <= names, sockets
    assert len(sockets) >= 6, sockets
    assert [s for s in sockets if s[1] not in LOOPBACK] == []
    assert process.returncode == 143, err
    assert set(committed_ids(run_dir).values()) == {1}


@pytest.mark.ray
def test_the_suites_own_cluster_listens_on_loopback_only(ray_cluster: str) -> None:
    """The session's Ray cluster (tests/conftest.py) is as private as the collector's: every
    socket its GCS, raylet and workers listen on is a loopback one."""
    import os

    sockets = [s for s in listening(os.getpid()) if s[0] != psutil.Process().name()]
    assert {"gcs_server", "raylet"} <= {name for name, _, _ in sockets}, sockets
    assert [s for s in sockets if s[1] not in LOOPBACK] == []
