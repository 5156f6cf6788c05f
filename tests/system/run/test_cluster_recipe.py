"""docs/clusters.md's single-host test cluster runs as written: two loopback Ray nodes, a
`cluster-check` that finds both, a run spread over both (its `node` column names two nodes),
and no socket of that cluster listening beyond loopback.

The block is read from the page and each line run by bash in a directory laid out like the
repository (`scripts/`, `configs/` linked), with one change: a free port replaces 6390 (the
machine is shared). Every process of the cluster carries the script's marker variable, found
by /proc; `stop` (the page's last line) kills them, and the test kills any left by pid.
"""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pytest

from collector.analysis.stats import read_committed
from tests.docblocks import REPO, all_blocks, commands

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

PAGE = REPO / "docs" / "clusters.md"
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
#: A guard against a hung command, never a measurement.
GUARD_S = 300


def _recipe() -> list[str]:
    mine = "tests/system/run/test_cluster_recipe.py"
    [block] = [b for b in all_blocks() if b.page == PAGE and b.run_by == mine]
    return commands(block.code)


def _free_base() -> int:
    """A port P with P..P+19 free on loopback now (the script's ports)."""
    for _ in range(200):
        base = random.randrange(20000, 60000)
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + 20):
                    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return base
    raise AssertionError("no 20 free consecutive ports")


def _cluster_pids(port: int) -> list[int]:
    needle = f"COLLECTOR_LOOPBACK_CLUSTER_{port}=1".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{entry}/environ").read_bytes():
                    found.append(int(entry))
    return found


def _listening_off_loopback(port: int) -> list[tuple[str, str, int]]:
    import psutil

    found = []
    for pid in _cluster_pids(port):
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            found += [(proc.name(), c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                      if c.status == psutil.CONN_LISTEN and c.laddr.ip not in LOOPBACK]
    return found


@pytest.fixture
def port() -> Iterator[int]:
    """A free base port; whatever of the cluster is left at the end is killed by pid."""
    base = _free_base()
    try:
        yield base
    finally:
        for pid in _cluster_pids(base):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def test_loopback_cluster_recipe_runs_as_written(tmp_path: Path, port: int) -> None:
    """The page's test-cluster recipe starts two loopback-only nodes that a run uses both of."""
    for name in ("scripts", "configs"):
        (tmp_path / name).symlink_to(REPO / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # A user's shell: the venv's programs first, this checkout's collector on every node.
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(REPO))
    lines = _recipe()
    assert lines[0].startswith("bash scripts/loopback-cluster start 6390")
    assert lines[-1].startswith("bash scripts/loopback-cluster stop 6390")
    outputs = []
    for line in lines[:-1]:
        command = line.replace("6390", str(port))
        proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, text=True, capture_output=True,
                              timeout=GUARD_S, check=False)
        assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
        outputs.append(proc.stdout)
        if "start" in shlex.split(command):
            assert _cluster_pids(port)
            assert _listening_off_loopback(port) == []
    assert "usable: 2 node(s) alive, 2 CPU(s)" in outputs[1]
    assert _listening_off_loopback(port) == []  # with the run's workers up too
    nodes = pc.unique(read_committed(tmp_path / "runs" / "two-nodes", ["node"]).column("node")).to_pylist()
    assert len(nodes) == 2
    assert all(n and n.startswith(socket.gethostname() + ":") for n in nodes)
    stop = subprocess.run(["bash", "-c", lines[-1].replace("6390", str(port))], cwd=tmp_path, env=env,
                          text=True, capture_output=True, timeout=GUARD_S, check=False)
    assert stop.returncode == 0, stop.stderr
    assert _cluster_pids(port) == []
