"""A tiny Chrome DevTools Protocol client: headless Chromium from Debian's packages, driven
over its loopback websocket, for tests that must see a page as a browser shows it.

Why not Playwright: its browser download is a network fetch the workplace forbids, and the
page needs only a few CDP commands (navigate, evaluate, click through the page's own DOM,
screenshot) plus the Network / Runtime / Log events that say whether the page asked the
network for anything or logged an error. `websockets` (sync client) carries them.

`find_chromium` finds the `chromium` that scripts/system-setup installs, or fails the test
saying how to install it: a browser test is never skipped.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect


def find_chromium() -> str:
    """The path of Debian's `chromium`, which scripts/system-setup installs (a browser test is
    never skipped: without it the test fails, naming the command that installs it)."""
    found = shutil.which("chromium")
    if not found:
        raise RuntimeError("no `chromium` on PATH: `bash scripts/system-setup` installs it (apt-get)")
    return found


class Browser:
    """One headless Chromium with one page (a CDP session on one target)."""

    def __init__(self, binary: str, profile: Path, width: int = 1280, height: int = 900) -> None:
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--metrics-recording-only",
             f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1",
             "--remote-debugging-port=0", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        # websockets 17 wants its sync connection used as a context manager: kept open here.
        self._stack = contextlib.ExitStack()
        try:
            self.ws: ClientConnection = self._stack.enter_context(
                connect(f"ws://127.0.0.1:{port}{path}", max_size=64 * 2**20))
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            attached = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
            self.session = attached["sessionId"]
            for domain in ("Page", "Runtime", "Network", "Log"):
                self.send(f"{domain}.enable", session=True)
        except BaseException:
            self.close()
            raise

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: bool = False,
             timeout: float = 30) -> dict[str, Any]:
        """Send one command and return its result; events read meanwhile go to `events`."""
        msg_id = next(self._ids)
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while True:
            reply = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 30) -> dict[str, Any]:
        """The first event named `method` (already received or arriving within `timeout`)."""
        for event in self.events:
            if event.get("method") == method:
                return event
        deadline = time.monotonic() + timeout
        while True:
            event = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            self.events.append(event)
            if event.get("method") == method:
                return event

    def open(self, url: str) -> None:
        self.events.clear()
        self.send("Page.navigate", {"url": url}, session=True)
        self.wait_for("Page.loadEventFired")

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (exceptions raise)."""
        out = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True}, session=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression[:80]}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False},
                         session=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def errors(self) -> list[dict[str, Any]]:
        """Console errors, uncaught exceptions and browser log errors (a CSP violation is one)."""
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if (m == "Runtime.exceptionThrown"
                    or (m == "Runtime.consoleAPICalled" and p.get("type") == "error")
                    or (m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error")):
                out.append(e)
        return out

    def requests(self) -> list[str]:
        """The URL of every request the page made (the document itself included)."""
        return [e["params"]["request"]["url"] for e in self.events
                if e.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        stack = getattr(self, "_stack", None)
        if stack is not None:
            stack.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
