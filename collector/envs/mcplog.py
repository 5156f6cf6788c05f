"""A bound on what the MCP SDK writes to the worker's logs.

Tests: tests/system/envs/test_mcp.py.

The SDK logs a full traceback, with the offending line quoted, for every stdout line of a
stdio server that is not JSON-RPC (``Failed to parse JSONRPC message from server``): a
server that prints its own debug output to stdout wrote 12 MB of worker logs in 5 s. So a
filter on the SDK's loggers (`install`, idempotent, called when an MCP environment is built):

- rate-limits: at most `BURST` records of one kind (logger and message template) per
  `WINDOW_S` seconds; the next one let through says how many were dropped meanwhile;
- truncates: a record let through is rendered once (message and traceback) and cut to
  `MAX_RECORD_CHARS`, so a megabyte line quoted in a traceback stays a few lines;
- scrubs: the credentials MCP environments registered (`add_secrets`: `pass_env` values,
  URL credentials) are replaced by ``[redacted credential]``, so a server that prints its
  key does not put it in the logs either.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable

from collector.turn import REDACTED_CREDENTIAL

#: The SDK's loggers that report per-message trouble (a filter on a logger sees only the
#: records logged on that logger, not its children's: each is named).
SDK_LOGGERS = (
    "mcp",
    "mcp.client.stdio",
    "mcp.client.session",
    "mcp.client.streamable_http",
    "mcp.shared.jsonrpc_dispatcher",
    "mcp.shared.session",
)
BURST = 5
WINDOW_S = 10.0
MAX_RECORD_CHARS = 2000


class SDKLogGuard(logging.Filter):
    """Rate-limits, truncates and scrubs records of the MCP SDK (see the module docstring)."""

    def __init__(
        self, burst: int = BURST, window_s: float = WINDOW_S, max_chars: int = MAX_RECORD_CHARS
    ) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self.max_chars = max_chars
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, str], tuple[float, int, int]] = {}
        """(logger, template) -> (window start, records let through in it, records dropped)."""
        self._secrets: set[str] = set()
        self._pattern: re.Pattern[str] | None = None

    def add_secrets(self, values: Iterable[str]) -> None:
        with self._lock:
            before = len(self._secrets)
            self._secrets.update(v for v in values if v)
            if len(self._secrets) != before:
                forms = sorted(self._secrets, key=len, reverse=True)
                self._pattern = re.compile("|".join(map(re.escape, forms)))

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg)[:200])
        now = time.monotonic()
        with self._lock:
            start, passed, dropped = self._windows.get(key, (now, 0, 0))
            if now - start >= self.window_s:
                start, passed = now, 0
            if passed >= self.burst:
                self._windows[key] = (start, passed, dropped + 1)
                return False
            self._windows[key] = (start, passed + 1, 0)
            if len(self._windows) > 1024:  # bounded: templates are the SDK's, but be safe
                self._windows.clear()
            pattern = self._pattern
        text = self._render(record)
        if dropped:
            text += f" [{dropped} more like this dropped]"
        if pattern is not None:
            text = pattern.sub(REDACTED_CREDENTIAL, text)
        if len(text) > self.max_chars:
            text = text[: self.max_chars] + f"... [{len(text) - self.max_chars:,} more characters cut]"
        # Rendered once here, so no handler formats the (unbounded) original again.
        record.msg, record.args = text, None
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True

    def _render(self, record: logging.LogRecord) -> str:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is still bounded, not a crash
            text = str(record.msg)
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            # The exception's own line, not the traceback: the frames are the SDK's and the
            # same every time; the message says what the server sent.
            text += f": {type(exc).__name__}: {' '.join(str(exc).split())}"
        return text


GUARD = SDKLogGuard()
_installed = False
_install_lock = threading.Lock()


def install() -> SDKLogGuard:
    """Put `GUARD` on the SDK's loggers (once per process) and return it."""
    global _installed
    with _install_lock:
        if not _installed:
            for name in SDK_LOGGERS:
                logging.getLogger(name).addFilter(GUARD)
            _installed = True
    return GUARD
