"""A local OpenEnv server started by the collector: a command, a free port, a health check.

Tests: tests/system/test_openenv_server.py.

`env.options.server` is a command (a list) that serves an OpenEnv app on the port written
``{port}`` in it, e.g. ``["python", "-m", "uvicorn", "my_env.server.app:app", "--port",
"{port}"]``; ``python`` runs under the worker's own interpreter, with the worker's
`sys.path` as its PYTHONPATH (so a server module beside the environment imports the same
way, as for the `mcp` environment). The server counts as up when ``GET /health`` answers
200; one that exits first or is not up within `startup_timeout_s` is an
`EnvironmentFailure` quoting the last line it wrote to stderr.

`LocalServer.stop` terminates the process (then kills it after 5 s); a process still
running when the worker exits is killed then, so none outlives its worker.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import socket
import sys
import tempfile
import time
from typing import IO

import httpx

from collector.errors import EnvironmentFailure

__all__ = ["LocalServer", "free_port"]

_RUNNING: set[asyncio.subprocess.Process] = set()


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_RUNNING):
        with contextlib.suppress(ProcessLookupError):
            process.kill()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class LocalServer:
    """One server process (see the module docstring)."""

    def __init__(self, command: tuple[str, ...], startup_timeout_s: float) -> None:
        self.command = command
        self.startup_timeout_s = startup_timeout_s
        self.url = ""
        self._process: asyncio.subprocess.Process | None = None
        self._stderr: IO[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    def _last_line(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        tail = self._stderr.read()[-4096:].decode("utf-8", "replace")
        lines = [line for line in tail.splitlines() if line.strip()]
        return f"; its last words: {lines[-1].strip()[:200]}" if lines else ""

    async def start(self) -> str:
        """Start the process and wait until it is healthy; its base URL."""
        await self.stop()  # a process that died is restarted, never left behind
        port = free_port()
        args = [part.replace("{port}", str(port)) for part in self.command]
        env = dict(os.environ)
        if args[0] == "python":
            args[0] = sys.executable
            env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process
        try:
            self._process = await asyncio.create_subprocess_exec(
                *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=self._stderr, env=env,
            )
        except OSError as exc:
            await self.stop()
            raise EnvironmentFailure(f"openenv server command {args[0]!r} cannot start: {exc}") from None
        _RUNNING.add(self._process)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + self.startup_timeout_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                if self._process.returncode is not None:
                    failure = EnvironmentFailure(
                        f"openenv server command exited with code {self._process.returncode} "
                        f"before serving{self._last_line()}")
                    await self.stop()
                    raise failure
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(self.url + "/health")).status_code == 200:
                        return self.url
                if time.monotonic() > deadline:
                    failure = EnvironmentFailure(
                        f"openenv server command was not serving on port {port} within "
                        f"{self.startup_timeout_s:g} s{self._last_line()}")
                    await self.stop()
                    raise failure
                await asyncio.sleep(0.1)

    async def stop(self) -> None:
        process, self._process = self._process, None
        stderr, self._stderr = self._stderr, None
        if stderr is not None:
            stderr.close()
        if process is None:
            return
        _RUNNING.discard(process)
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 5.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
