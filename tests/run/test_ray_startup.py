"""Ray's start-up in one line: `ray.init` bounded by `ray.start_timeout_s` with the address and
the likely cause named, any exception of Ray's start-up one line, and every episode's `node`.
(A real two-node cluster: tests/system/run/test_cluster_recipe.py.)"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from collector.analysis.stats import read_committed
from collector.errors import ConfigError
from collector.run import cluster
from collector.run.clusterprobe import start_within
from collector.run.job import run_job
from tests.run.helpers import small_config


def test_a_join_that_never_ends_is_bounded_and_names_the_cause() -> None:
    """A `ray.init` still running at `ray.start_timeout_s` is given up on with one line naming the address."""
    release = threading.Event()
    started = time.monotonic()
    try:
        with pytest.raises(ConfigError) as info:
            start_within(release.wait, 0.2, "127.0.0.1:6390")
    finally:
        release.set()
    assert time.monotonic() - started < 5.0
    message = str(info.value)
    assert "\n" not in message
    assert "cannot join the Ray cluster at 127.0.0.1:6390 within ray.start_timeout_s = 0.2s" in message
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in message
    with pytest.raises(ConfigError, match="RAY_AUTH_MODE"):
        start_within(threading.Event().wait, 0.05, "10.0.0.1:6379")


def test_every_start_up_failure_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's plain `Exception` (its own start-up timeout) becomes one line, not a traceback."""
    def fail(*_args: object) -> None:
        raise Exception("The current node timed out during startup.\n" + "  detail\n" * 30)

    monkeypatch.setattr(cluster, "_init", fail)
    with pytest.raises(ConfigError) as info, cluster.ray_session(None, 2, 5.0):
        pass
    assert str(info.value) == ("ray: the embedded local cluster failed to start: "
                               "The current node timed out during startup.")


def test_every_episode_names_its_node(tmp_path: Path) -> None:
    """With the in-process pool every episode's `node` is this machine's host name."""
    run_dir = tmp_path / "run"
    run_job(small_config(run_dir), show_progress=False)
    nodes = read_committed(run_dir, ["node"]).column("node").to_pylist()
    assert nodes
    assert set(nodes) == {socket.gethostname()}
