"""Text for a terminal: model output and tool results made inert before they are printed.

A transcript holds whatever a model or a tool wrote, and a terminal obeys the control
characters in it: ESC sequences retitle the window, clear the screen, move the cursor or
rewrite earlier lines, and a carriage return overprints a line. `escape_controls` shows each
such character as a visible escape (`\\x1b`, `\\r`, `\\x9b`) and keeps newlines and tabs, so
what `collector show` prints on a terminal is exactly what was stored, readable and unable to
act. Output to a pipe or a file is left as stored (a script reading it gets the bytes).

Tests: tests/analysis/test_show_terminal.py.
"""

from __future__ import annotations

import re

__all__ = ["escape_controls"]

# C0 controls but newline and tab, DEL, and the C1 controls (U+0080-U+009F: a terminal in
# 8-bit mode reads U+009B as CSI, the same as ESC [).
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    return "\\r" if char == "\r" else f"\\x{ord(char):02x}"


def escape_controls(text: str) -> str:
    """`text` with every terminal control character but newline and tab shown as an escape."""
    return _CONTROLS.sub(_visible, text)
