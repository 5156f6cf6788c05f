"""The report at 1400 px, as a person looks at it in Chromium (`tests.system.cdp`): the truncation
table and the comparison of two runs fit the page (no column cut off behind a scroll bar), and
every transcript's summary line names its task, and opened transcripts (token strips included)
wrap instead of widening the page. Screenshots are kept beside the test's page."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.cli import main
from collector.run.job import run_job
from tests.run.helpers import small_config
from tests.system.cdp import Browser, find_chromium

FITS = """(function (id) {
  var t = document.getElementById(id);
  return [t.scrollWidth, t.parentElement.clientWidth];
})"""


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    b = Browser(find_chromium(), tmp_path / "profile", width=1400, height=900)
    try:
        yield b
    finally:
        b.close()


def _demo_like(run_dir: Path, budgets: list[int], seed: int) -> Path:
    """Four simulated models at six budgets, as the demo sweeps them (few tasks)."""
    cfg = small_config(run_dir, sweep__models=["sim-terse", "sim-verbose", "sim-hidden-cut", "sim-sloppy"],
                       sweep__budgets=budgets, env__name="support_desk", env__tasks=None,
                       env__options={"num_tasks": 4}, seed=seed)
    run_job(cfg, show_progress=False)
    return run_dir


def test_the_report_fits_1400_px_and_names_tasks(tmp_path: Path, browser: Browser) -> None:
    """At 1400 px the stats and comparison tables show every column, and transcripts name their task."""
    a = _demo_like(tmp_path / "a", [32, 64, 96, 128, 192, 256], 0)
    b = _demo_like(tmp_path / "b", [64, 128, 256, 512], 7)
    page = tmp_path / "ab.html"
    assert main(["report", str(a), str(b), "-o", str(page)]) == 0
    browser.open(page.as_uri())
    assert browser.errors() == []
    for table in ("stats", "comparison"):
        width, room = browser.eval(f"{FITS}({table!r})")
        assert width <= room, (table, width, room)
    browser.eval("document.getElementById('stats').scrollIntoView()")
    browser.screenshot(tmp_path / "stats-1400.png")
    summaries = browser.eval("Array.from(document.querySelectorAll('details.ep > summary'))"
                             ".map(s => s.innerText)")
    assert summaries
    assert all(" · task desk-" in s for s in summaries)
    # An opened transcript (token ids are captured by default: its token strip too) wraps.
    browser.eval("document.querySelectorAll('details.ep').forEach(d => { d.open = true; })")
    width, room = browser.eval("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width <= room, (width, room)
