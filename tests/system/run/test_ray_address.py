"""An unreachable `--address` / `ray.address` is one line naming the address as the user gave it,
within `ray.start_timeout_s`, and no Ray warning lines."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from collector.errors import ConfigError
from collector.run.clusterprobe import probe_cluster
from tests.run.test_cli import write_config
from tests.run.test_worker import free_port

REPO = Path(__file__).resolve().parents[3]

# The safety net only: the fixed driver answers at once for a closed port (connection
# refused); today's drivers retried for minutes, which this would cut and report.
pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("how", ["--address", "ray.address"])
def test_unreachable_address_is_one_line_naming_it(tmp_path: Path, how: str) -> None:
    """A closed loopback port as the cluster address: exit 2, one stderr line naming that address."""
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    where = ["--address", address] if how == "--address" else ["--set", f'ray.address="{address}"']
    proc = subprocess.run(
        [sys.executable, "-m", "collector.cli", "run", str(write_config(tmp_path)), "--quiet",
         "--set", "ray.start_timeout_s=5", *where],
        capture_output=True, text=True, cwd=REPO, timeout=110,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith("collector: error: ray.address: cannot reach a Ray cluster at " + address)
    assert "Traceback" not in proc.stderr


def _serve_once(reply: bytes | None) -> tuple[socket.socket, threading.Thread | None]:
    """A loopback listener: silent (never accepts, never answers) or answering `reply` once."""
    listener = socket.create_server(("127.0.0.1", 0))
    if reply is None:
        return listener, None

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(1024)
            conn.sendall(reply)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return listener, thread


@pytest.mark.parametrize("reply", [None, b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n"])
def test_a_port_where_something_else_listens_is_one_line(reply: bytes | None) -> None:
    """An address that accepts connections but is no Ray cluster (silent, or another protocol) is refused."""
    listener, thread = _serve_once(reply)
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    with listener, pytest.raises(ConfigError) as info:
        probe_cluster(address, timeout_s=1.0)
    message = str(info.value)
    assert "\n" not in message
    assert address in message
    if thread is not None:
        thread.join(timeout=5)


@pytest.mark.ray
def test_a_live_cluster_passes_the_probe(ray_cluster: str) -> None:
    """The probe accepts a real Ray GCS address (it answers the HTTP/2 preface as gRPC must)."""
    probe_cluster(ray_cluster, timeout_s=10.0)
