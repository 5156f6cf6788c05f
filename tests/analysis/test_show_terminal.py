"""`collector show` on a terminal: model output cannot drive the terminal it is read on."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from collector.analysis.terminal import escape_controls
from collector.cli import main
from collector.storage.local import LocalRunStore
from tests.record.factory import make_episode

# Retitles the window, clears the screen, overprints the line, and a C1 CSI (ESC [ in 8 bits).
HOSTILE = "ok\x1b]0;pwned\x07\x1b[2J\rfake line\x9b31m done\ttab"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run_with_hostile_text(tmp_path: Path) -> tuple[Path, str]:
    ep = make_episode()
    assistant = next(m for m in ep.messages if m.role == "assistant")
    assistant.text = HOSTILE
    tool = next(m for m in ep.messages if m.role == "tool")
    tool.text = "result \x1b[1A\x1b[K"
    with LocalRunStore.open(tmp_path / "run", "fp", {}, "arrow", 10) as st:
        st.commit([ep])
    return tmp_path / "run", ep.episode_id


def test_show_on_a_terminal_prints_no_control_characters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a terminal `collector show` prints ESC, CR, BEL and C1 controls from model output and
    tool results as visible escapes, keeping newlines and tabs."""
    run, episode_id = _run_with_hostile_text(tmp_path)
    out = _Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["show", str(run), episode_id]) == 0
    text = out.getvalue()
    for control in ("\x1b", "\x07", "\r", "\x9b"):
        assert control not in text
    assert "ok\\x1b]0;pwned\\x07\\x1b[2J\\rfake line\\x9b31m done\ttab" in text
    assert "result \\x1b[1A\\x1b[K" in text
    assert "\n" in text


def test_show_to_a_pipe_keeps_the_stored_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Piped, `collector show` prints the stored text unchanged, for scripts that read it."""
    run, episode_id = _run_with_hostile_text(tmp_path)
    assert main(["show", str(run), episode_id]) == 0
    assert HOSTILE in capsys.readouterr().out


def test_escape_controls_keeps_printable_text() -> None:
    """Printable text, newlines and tabs, accents and emoji pass through unchanged."""
    text = "naïve café\n\tdone 🎉 — ok"
    assert escape_controls(text) == text
    assert escape_controls("a\x00b\x7fc") == "a\\x00b\\x7fc"
