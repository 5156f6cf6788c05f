"""The progress line: live counts per stop reason, throttled, plain text on a stream."""

from __future__ import annotations

import io

from collector.run.progress import LiveCounts, Progress, format_counts


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_counts_in_stable_order_without_zeros() -> None:
    """Outcomes come first, faults after, unknown reasons last; zero counts are left out."""
    counts = {"error": 1, "length": 3, "done": 5, "max_steps": 0, "custom": 2}
    assert format_counts(counts) == "done 5 length 3 error 1 custom 2"


def test_log_mode_prints_a_line_per_interval() -> None:
    """Off a terminal, one full line per interval; calls in between print nothing."""
    out, clock = io.StringIO(), Clock()
    progress = Progress(100, stream=out, live=False, log_interval_s=5.0, clock=clock)
    clock.now = 1.0
    progress.update(10, {"done": 8, "length": 2})
    clock.now = 2.0
    progress.update(20, {"done": 16, "length": 4})
    clock.now = 7.0
    progress.update(30, {"done": 24, "length": 6})
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("[##                  ] 10/100  10%")
    assert "done 8 length 2" in lines[0]
    assert "done 24 length 6" in lines[1]


def test_resume_counts_earlier_episodes_and_live_mode_rewrites_in_place() -> None:
    """A resumed run starts from what was already committed; on a terminal the line is rewritten."""
    out, clock = io.StringIO(), Clock()
    progress = Progress(10, already=5, stream=out, live=True, clock=clock)
    clock.now = 1.0
    progress.update(1, {"done": 1})
    clock.now = 2.0
    progress.close(5, {"done": 4, "length": 1})
    text = out.getvalue()
    assert text.startswith("\r[############        ] 6/10  60%")
    assert "\r[####################] 10/10 100%" in text
    assert text.endswith("\n")
    assert text.count("\n") == 1


def test_finished_episodes_lead_and_committed_is_the_second_number() -> None:
    """Bar, rate and ETA follow finished episodes; the committed count is shown beside them."""
    out, clock = io.StringIO(), Clock()
    progress = Progress(100, already=10, stream=out, live=False, clock=clock)
    clock.now = 10.0
    progress.update(0, {"done": 15, "length": 5}, finished=20, force=True)
    line = out.getvalue()
    assert line.startswith("[######              ] 30/100  30% (10 committed) | 2.0 ep/s eta 35s")
    assert "done 15 length 5" in line


def test_live_counts_add_unreturned_episodes_of_live_workers_once() -> None:
    """A finished episode counts once (reported, returned or both); a dead worker's unreturned ones never."""
    live = LiveCounts()
    live.reported("w1", {"done": 3, "length": 1})
    live.reported("w2", {"done": 2})
    assert live.counts(["w1", "w2"]) == {"done": 5, "length": 1}
    live.returned("w1", ["done", "done"])
    for reason in ("done", "done"):
        live.keep(reason)
    assert live.counts(["w1", "w2"]) == {"done": 5, "length": 1}
    live.returned("w1", ["done", "length", "done"])  # one finished after its last report
    for reason in ("done", "length", "done"):
        live.keep(reason)
    assert live.counts(["w1", "w2"]) == {"done": 6, "length": 1}
    assert live.counts(["w1"]) == {"done": 4, "length": 1}  # w2 died: its episodes run again
