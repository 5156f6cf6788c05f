"""The embedded cluster of a single-machine `collector run` (`collector.run.cluster`): what it runs
and where it listens, read off one run on its own embedded cluster (a Ray start is most of a
test's time here, so both checks share it).

- It runs what the run needs and not Ray's extras (`EMBEDDED_SYSTEM_CONFIG`): no prestarted
  idle worker polling beside the run's own, while the run still works and reports progress.
- It listens on loopback only: its GCS, raylet, agents, workers and the driver itself. What is
  checked is the sockets, not an argument (Ray rewrote a loopback node address to the
  machine's own).

What is read: the process tree and every listening socket of the driver's tree (psutil) once
the run has committed a shard (the workers are up and running episodes), then the progress
lines the run wrote to its stderr (a pipe: a full line every few seconds) after a SIGTERM.
"""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path

import psutil
import pytest

from tests.checking import committed_ids
from tests.system.processes import LOOPBACK, SLOW, WAIT_GUARD_S, listening, start_and_wait_for_a_commit

pytestmark = pytest.mark.timeout(600)


def commands(pid: int) -> list[str]:
    """The command line of `pid`'s every descendant (Ray names its workers there: `ray::...`)."""
    found = []
    for proc in psutil.Process(pid).children(recursive=True):
        try:
            found.append(" ".join(proc.cmdline()))
        except psutil.Error:
            continue  # ended meanwhile
    return found


@dataclasses.dataclass(frozen=True)
class EmbeddedRun:
    """What one `collector run` on its embedded cluster showed, mid-run and at its end."""

    tree: list[str]  # the command lines of the driver's descendants
    sockets: list[tuple[str, str, int]]  # (process, address, port) of every listening socket
    returncode: int
    stderr: str
    run_dir: Path


@pytest.fixture(scope="module")
def embedded_run(tmp_path_factory: pytest.TempPathFactory) -> EmbeddedRun:
    """A slow sweep on the embedded cluster, read once it has committed a shard, then SIGTERMed."""
    tmp_path = tmp_path_factory.mktemp("embedded")
    config, run_dir = tmp_path / "slow.toml", tmp_path / "run"
    config.write_text(SLOW.format(run_dir=run_dir))
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "w") as stderr:
        process = start_and_wait_for_a_commit(config, run_dir, quiet=False, stderr=stderr)
    try:
        tree, sockets = commands(process.pid), listening(process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=WAIT_GUARD_S)
    return EmbeddedRun(tree, sockets, process.returncode, stderr_path.read_text(), run_dir)


def test_the_embedded_cluster_starts_no_idle_worker_and_the_run_reports_progress(
    embedded_run: EmbeddedRun,
) -> None:
    """The run's worker, Ray's GCS and raylet, and no idle worker; progress lines on the pipe;
    SIGTERM's exit code with every committed episode once."""
    tree, err = embedded_run.tree, embedded_run.stderr
    assert [c for c in tree if c.startswith("ray::_WorkerActor")], tree
    assert [c for c in tree if c.startswith("ray::IDLE")] == [], tree
    assert any(name in c for c in tree for name in ("raylet", "gcs_server")), tree
    assert embedded_run.returncode == 143, err
    lines = [line for line in err.splitlines() if "committed)" in line]
    assert lines, err
    assert "ep/s" in lines[-1], err
    assert set(committed_ids(embedded_run.run_dir).values()) == {1}


def test_the_embedded_cluster_listens_on_loopback_only(embedded_run: EmbeddedRun) -> None:
    """Mid-run, every socket the run's processes listen on is a loopback one (there are many:
    GCS, raylet, agents, the worker, the driver)."""
    sockets = embedded_run.sockets
    names = {name for name, _, _ in sockets}
    assert {"gcs_server", "raylet"} <= names, sockets
    assert len(sockets) >= 6, sockets
    assert [s for s in sockets if s[1] not in LOOPBACK] == []
