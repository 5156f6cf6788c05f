"""`collector report`'s page as a person sees it: a real headless Chromium (Debian's `chromium`,
installed by scripts/system-setup), driven over CDP (`tests.system.cdp`) from a `file://` URL.
The page's numbers and escaping without a browser: tests/analysis/test_report.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.analysis import report
from tests.analysis.report_run import HOSTILE
from tests.analysis.test_report import _CELLS, _SHOWN, page, run, stats_json  # noqa: F401 - fixtures too
from tests.system.cdp import Browser, find_chromium


@pytest.fixture(scope="session")
def chromium() -> str:
    return find_chromium()


@pytest.fixture
def browser(chromium: str, tmp_path: Path) -> Iterator[Browser]:
    b = Browser(chromium, tmp_path / "profile")
    try:
        yield b
    finally:
        b.close()


def test_the_page_in_a_browser(run: Path, page: Path, browser: Browser, tmp_path: Path) -> None:
    """Loads from file:// with no error and no request; the table is `stats --format json`'s;
    every figure is drawn; the filters and sorting work; a transcript opens; nothing runs."""
    browser.open(page.as_uri())
    assert browser.errors() == []
    assert browser.requests() == [page.as_uri()]  # the document itself, nothing else

    expected = stats_json(run, "0.3")
    shown = browser.eval(_CELLS)
    rows = expected["rows"]  # type: ignore[index]
    assert len(shown) == len(rows) == 9  # sim-alpha x 3 budgets, sim-think x 3 budgets x 2 settings
    for cells, row in zip(shown, rows, strict=True):
        for key, value in cells.items():
            assert value == row[key], (key, value, row[key])  # exactly, unrounded
    wanted = {"truncation_rate", "trunc_low", "trunc_high", "target_budget", "thinking_cut_rate"}
    assert wanted <= set(shown[0])
    picks = browser.eval("document.querySelectorAll('#picks tbody tr').length")
    assert picks == len(expected["picks"])  # type: ignore[arg-type]

    figures = browser.eval("""Array.from(document.querySelectorAll('svg.figure')).map(s =>
        [s.getAttribute('aria-label'), s.querySelectorAll('path.data').length,
         s.getBoundingClientRect().width])""")
    titles = {t for t, _, _ in figures}
    assert {"Truncation rate, Wilson 95%", "Stop-reason mix per budget", "Wasted output tokens per episode",
            "Mean reward against budget", "Turns cut: calls vs answers", "Thinking cut per reasoning setting",
            "Retried requests by cause", "Error episodes by cause"} <= titles
    assert all(n > 0 and w > 0 for _, n, w in figures), figures

    total = browser.eval(_SHOWN)
    assert total == len(report.collect(run).sample) > 0
    browser.eval("(() => { const s = document.getElementById('f-stop'); s.value = 'length';"
                 " s.dispatchEvent(new Event('change')); })()")
    cut_only = browser.eval(_SHOWN)
    assert 0 < cut_only < total
    assert browser.eval("Array.from(document.querySelectorAll('details.ep')).filter(e => e.offsetParent"
                        " !== null).every(e => e.dataset.stop === 'length')")
    browser.eval("(() => { const s = document.getElementById('f-model'); s.value = 'sim-alpha';"
                 " s.dispatchEvent(new Event('change')); })()")
    assert browser.eval("Array.from(document.querySelectorAll('#stats tbody tr')).filter(r => r.offsetParent"
                        " !== null).every(r => r.dataset.model === 'sim-alpha')")
    hidden = "document.querySelector('section.model[data-model=\"sim-think\"]').offsetParent"
    assert browser.eval(hidden) is None

    before = browser.eval("Array.from(document.querySelectorAll('#stats tbody tr')).map(r => r.rowIndex)")
    order = ("Array.from(document.querySelectorAll('#stats tbody tr')).map(r =>"
             " JSON.parse(r.querySelector('[data-key=truncation_rate]').dataset.value))")
    browser.eval("document.querySelector('#stats th[data-key=truncation_rate]').click()")
    rates = [-math.inf if r is None else r for r in browser.eval(order)]
    assert rates == sorted(rates)
    assert len(before) == len(rates)

    # The first transcript is a cut one holding the hostile text: it opens, shows it as text.
    opened = browser.eval("""(() => { const d = Array.from(document.querySelectorAll('details.ep'))
        .find(e => e.textContent.includes('__pwned')); d.querySelector('summary').click();
        return [d.open, d.querySelector('.body').offsetHeight > 0,
                d.querySelectorAll('.b-cut').length, d.querySelectorAll('.b-discarded').length,
                d.querySelectorAll('.b-replayed').length, d.querySelectorAll('.b-settled').length,
                d.querySelectorAll('.tokens .tok').length, d.querySelectorAll('.tok.m0').length,
                d.querySelector('.msg.role-user pre').textContent]; })()""")
    is_open, visible, cut, discarded, replayed, settled, tokens, masked, text = opened
    assert is_open
    assert visible
    assert cut >= 2
    assert discarded >= 1
    assert replayed == 1
    assert settled == 1
    assert tokens > masked > 0  # the discarded turn's tokens carry loss mask 0
    assert HOSTILE in text
    assert browser.eval("typeof window.__pwned") == "undefined"
    assert browser.eval("document.scripts.length") == 1
    assert browser.errors() == []
    assert browser.requests() == [page.as_uri()]
    shot = browser.screenshot(tmp_path / "report.png")
    assert shot.stat().st_size > 10_000

