"""`collector report` bounds what its page holds per message, per transcript and in all, and
the memory it takes to build it, whatever the episodes hold (collector.analysis.report)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from collector.analysis import report
from collector.analysis.report_data import MAX_TEXT, collect
from collector.record.episode import Episode, MessageRecord
from collector.storage.local import LocalRunStore
from tests.record.factory import make_batch

HUGE = 900_000
BUDGETS = (16, 32, 64, 128, 256, 512, 1024, 2048)


def _huge(ep: Episode) -> Episode:
    """`ep` with 900 KB tool-call arguments and a 900 KB message text."""
    call = next(c for m in ep.messages for c in m.tool_calls)
    call.arguments_json = '{"blob": "' + "a" * HUGE + '"}'
    next(m for m in ep.messages if m.role == "tool").text = "r" * HUGE
    return ep


@pytest.fixture(scope="module")
def huge_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """32 sampled episodes (4 per cell over 8 budgets), each holding 1.8 MB of text."""
    run = tmp_path_factory.mktemp("huge") / "run"
    with LocalRunStore.open(run, "fp-huge", {}, "arrow", 64) as st:
        for budget in BUDGETS:
            st.commit([_huge(ep) for ep in make_batch(4, budget=budget, start=budget)])
    return run


def test_the_page_holds_at_most_the_message_bound_of_huge_arguments(huge_run: Path) -> None:
    """900 KB tool-call arguments and message texts are shown up to MAX_TEXT characters each,
    with how many more there were, and the page stays small (it was 73 MB for 120 of them)."""
    text = report.build_report(huge_run)
    assert len(text) < 2_000_000
    assert text.count("a" * (MAX_TEXT - 10)) == 32  # after the 10 characters of {"blob": "
    assert "a" * (MAX_TEXT + 1) not in text
    assert "r" * (MAX_TEXT + 1) not in text
    assert f"{HUGE + 12 - MAX_TEXT} more chars not shown" in text  # the arguments' whole length counted


def test_building_the_page_takes_bounded_memory(huge_run: Path) -> None:
    """Reading the sample holds one episode's full strings at a time, not the sample's 58 MB."""
    tracemalloc.start()
    try:
        data = collect(huge_run)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(data.sample) == 32
    assert peak < 20_000_000, f"{peak / 1e6:.0f} MB to read the sample"


def test_a_transcript_of_many_long_messages_is_bounded(tmp_path: Path) -> None:
    """A transcript of 400 messages of MAX_TEXT characters shows what fits in its bound and
    counts the rest, naming the command that shows all of it."""
    ep = make_batch(1)[0]
    tool = next(m for m in ep.messages if m.role == "tool")
    ep.messages.extend(MessageRecord(role="user", text="u" * MAX_TEXT) for _ in range(400))
    assert tool.text is not None
    with LocalRunStore.open(tmp_path / "run", "fp", {}, "arrow", 8) as st:
        st.commit([ep])
    text = report.build_report(tmp_path / "run")
    assert len(text) < report.MAX_TRANSCRIPT_CHARS + 300_000
    assert "more messages not shown" in text
    assert f"collector show {ep.episode_id}" in text


def test_the_page_bounds_all_transcripts_together(huge_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the page's bound on transcripts, the remaining ones are counted, not drawn."""
    monkeypatch.setattr(report, "MAX_TRANSCRIPTS_CHARS", 100_000)
    text = report.build_report(huge_run)
    shown = text.count('<details class="ep"')
    assert 1 <= shown < 32
    assert f"{32 - shown} more transcripts not shown" in text
