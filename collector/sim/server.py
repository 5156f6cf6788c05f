"""Serving the simulator on loopback: in a background thread (`SimServer`) or blocking (`serve`).

Ray workers and the official SDKs' tests need a real socket; uvicorn is the standard ASGI
server. `SimServer` binds port 0 by default so the OS picks a free port, and reads the
bound port back from the listening socket; `start()` returns only once the server accepts
connections, and `stop()` waits for the thread to end.
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType

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
        return f"http://{self.host}:{self.port}"

    def start(self) -> SimServer:
        if self._server is not None:
            return self
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
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


def serve(host: str = "127.0.0.1", port: int = 8000, seed: int = 0) -> None:
    """Serve the simulator in the foreground until interrupted (`collector sim`)."""
    uvicorn.run(create_app(seed), host=host, port=port, log_level="info", access_log=False, lifespan="off")
