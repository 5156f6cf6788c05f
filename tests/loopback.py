"""Serve a test's own ASGI app (a fake provider) with uvicorn on a free loopback port."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from tests.faults.cluster import free_port


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """Run `app` in a background thread until the block ends; yields `http://127.0.0.1:PORT`."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline, "the loopback server did not start"
        assert thread.is_alive(), "the loopback server stopped while starting"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
