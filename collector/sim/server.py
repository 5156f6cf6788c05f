"""Serving the simulator on loopback: in a background thread (`SimServer`) or blocking (`serve`).

Ray workers and the official SDKs' tests need a real socket; uvicorn is the standard ASGI
server. `SimServer` binds port 0 by default so the OS picks a free port, and reads the
bound port back from the listening socket; `start()` returns only once the server accepts
connections, and `stop()` waits for the thread to end.

`serve` (the `collector sim` command) runs the same `SimServer` and blocks. The socket is
bound here, not inside uvicorn, for two reasons: a port that is taken or a host that does
not resolve raises `OSError` to the caller (uvicorn would log it and `sys.exit(3)`), and the
address the caller announces is the one actually listening (port 0 becomes the real port),
announced only once the server accepts connections. SIGINT and SIGTERM stop it as Ctrl-C
does, even in a process that inherited SIGINT ignored (a shell's background job).

Tests: tests/sim/test_sdks.py, tests/system/sim/test_cli_sim.py, tests/faults/test_provider_storms.py.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

import uvicorn

from collector.sim.app import create_app

_START_TIMEOUT_S = 15.0


class SimServer:
    """The simulator on a loopback port in a daemon thread. A context manager."""

    def __init__(self, seed: int = 0, host: str = "127.0.0.1", port: int = 0) -> None:
        self.seed = seed
        self.host = host
        self.port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def base_url(self) -> str:
        """`http://host:port` of the running server (no trailing slash, no `/v1`)."""
        if self._server is None:
            raise RuntimeError("SimServer is not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> SimServer:
        """Bind, listen and serve; returns once connections are accepted.

        Raises `ValueError` for a port outside 0..65535 and `OSError` when the address cannot
        be bound (taken, not resolvable, not local), with nothing left open.
        """
        if self._server is not None:
            return self
        sock = _listen(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._sock = sock
        config = uvicorn.Config(create_app(self.seed), log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=1)
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                        name=f"sim-server-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the simulated provider did not start")
            time.sleep(0.01)
        return self

    def wait(self) -> None:
        """Block until the server thread ends (`stop()` from another thread, or a crash).

        Interruptible: Ctrl-C raises `KeyboardInterrupt` here, in the main thread."""
        if self._thread is not None:
            self._thread.join()

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._sock is not None:
            self._sock.close()
        self._server = None
        self._thread = None
        self._sock = None

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port), IPv4 or IPv6 as `host` resolves."""
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be between 0 and 65535, got {port}")
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As uvicorn does: a restarted server may rebind a port whose old connections linger
        # in TIME_WAIT. A port with a live listener still fails with EADDRINUSE.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


def serve(host: str = "127.0.0.1", port: int = 8000, seed: int = 0,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve the simulator in the foreground until interrupted (`collector sim`).

    `on_ready(base_url)` is called once the server accepts connections, never before. A bad
    port raises `ValueError` and an address that cannot be bound `OSError`, before anything
    is served. Ctrl-C stops the server, then `KeyboardInterrupt` propagates to the caller.
    """
    server = SimServer(seed=seed, host=host, port=port).start()
    stopping = _stop_on_signals()
    try:
        if on_ready is not None:
            on_ready(server.base_url)
        server.wait()
    finally:
        server.stop()
        for signum, previous in stopping.items():
            signal.signal(signum, previous)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _stop_on_signals() -> dict[int, Any]:
    """SIGINT and SIGTERM stop the foreground server as Ctrl-C does, whatever this process
    inherited: a shell starts a background job with SIGINT ignored (and Python then leaves it
    ignored), so `collector sim &` would outlive `kill -INT`. Returns the handlers replaced
    (none off the main thread, where signals cannot be caught)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, _raise_interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}
