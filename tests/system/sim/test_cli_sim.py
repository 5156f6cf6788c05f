"""`collector sim`: bad ports and taken ports are one-line errors (exit 2), and the address is
announced only once the server listens."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from collector.cli import EXIT_BAD_INPUT, EXIT_OK, main
from collector.sim.server import SimServer, serve
from tests.sim.conftest import ARITH, chat_body


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port with a live listener on it for the duration of the test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


@pytest.mark.parametrize("port", ["99999", "65536", "-1"])
def test_out_of_range_port_is_a_one_line_error(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A port outside 0..65535 exits 2 with one line naming the port, no traceback, no address."""
    assert main(["sim", "--port", port]) == EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"collector: error: --port must be between 0 and 65535, got {port}\n"


def test_taken_port_is_a_one_line_error(taken_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    """A port another process listens on exits 2 with one line, and no address is announced."""
    assert main(["sim", "--port", str(taken_port)]) == EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"collector: error: cannot listen on 127.0.0.1:{taken_port}: ")
    assert "in use" in err
    assert "simulated provider on" not in err


def test_serve_announces_nothing_when_it_cannot_bind(taken_port: int) -> None:
    """`serve` raises OSError before calling `on_ready` when the port is taken."""
    announced: list[str] = []
    with pytest.raises(OSError, match="in use") as refused:
        serve("127.0.0.1", taken_port, on_ready=announced.append)
    assert refused.value.errno == errno.EADDRINUSE
    assert announced == []


def test_sim_server_refuses_a_bad_port() -> None:
    """`SimServer` raises ValueError for a port outside 0..65535 instead of an OverflowError from bind."""
    with pytest.raises(ValueError, match="between 0 and 65535"):
        SimServer(port=70000).start()


@pytest.mark.parametrize(("signum", "inherited"), [(signal.SIGINT, "default"), (signal.SIGINT, "ignored"),
                                                   (signal.SIGTERM, "default")],
                         ids=["ctrl-c", "sigint-in-a-background-job", "sigterm"])
def test_announced_address_accepts_requests_and_ctrl_c_stops_cleanly(signum: int, inherited: str) -> None:
    """`collector sim --port 0` prints the real bound address only once it answers; SIGINT and
    SIGTERM exit 0, also when started as a shell starts a background job (SIGINT ignored)."""
    ignore = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); " if inherited == "ignored" else ""
    code = ignore + (
        "import sys; from collector.cli import main; sys.exit(main(['sim', '--port', '0', '--seed', '3']))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("simulated provider on http://127.0.0.1:")
        assert line.endswith(" (seed 3); Ctrl-C stops it\n")
        base_url = line.split()[3]
        assert not base_url.endswith(":0")
        # Right after the announcement, with no wait: the server must already be listening.
        reply = httpx.post(
            f"{base_url}/v1/chat/completions", json=chat_body("sim-perfect", ARITH, 64), timeout=10
        )
        assert reply.status_code == 200
        proc.send_signal(signum)
        assert proc.wait(timeout=20) == EXIT_OK
        assert proc.stderr.read() == "collector: simulated provider stopped\n"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
