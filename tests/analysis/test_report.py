"""`collector report` (`collector.analysis.report`): the page in a real headless Chromium, the
numbers against `collector stats --format json`, escaping of model output, the sample.

The browser is Debian's `chromium`, installed by the session fixture when missing (an apt
failure fails the tests), driven over CDP (`tests.analysis.cdp`) from a `file://` URL.
"""

from __future__ import annotations

import contextlib
import html
import io
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector import cli
from collector.analysis import report, svgplot
from collector.analysis.episodes import load_episodes
from collector.storage.local import LocalRunStore
from tests.analysis.cdp import Browser, ensure_chromium
from tests.analysis.report_run import HOSTILE, build_run
from tests.s3server import S3Bucket


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_run(tmp_path_factory.mktemp("report") / "run")


@pytest.fixture(scope="module")
def page(run: Path) -> Path:
    out = run.parent / "report.html"
    assert cli.main([ "report", str(run), "-o", str(out), "--target", "0.3"]) == 0
    return out


@pytest.fixture(scope="session")
def chromium() -> str:
    return ensure_chromium()


@pytest.fixture
def browser(chromium: str, tmp_path: Path) -> Iterator[Browser]:
    b = Browser(chromium, tmp_path / "profile")
    try:
        yield b
    finally:
        b.close()


def stats_json(run: Path, target: str) -> dict[str, object]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["stats", str(run), "--format", "json", "--target", target]) == 0
    payload: dict[str, object] = json.loads(out.getvalue())
    return payload


_CELLS = """Array.from(document.querySelectorAll('#stats tbody tr')).map(tr =>
  Object.fromEntries(Array.from(tr.cells).map(td => [td.dataset.key, JSON.parse(td.dataset.value)])))"""
_SHOWN = "Array.from(document.querySelectorAll('details.ep')).filter(e => e.offsetParent !== null).length"


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


def test_model_output_is_escaped(run: Path, page: Path) -> None:
    """Run text reaches the page only escaped: the hostile message, and no second <script>."""
    text = page.read_text(encoding="utf-8")
    assert HOSTILE not in text
    assert html.escape(HOSTILE, quote=True) in text
    assert text.count("<script") == 1
    assert "step by step &lt;b&gt;first&lt;/b&gt;</pre>" in text  # the reasoning of a thinking cut
    assert "Content-Security-Policy" in text


def test_sample_is_cut_first_per_cell(run: Path) -> None:
    """Each cell shows at most PER_CELL episodes, cut ones first, and one of another kind too."""
    data = report.collect(run)
    cells: dict[tuple[str, int, str | None], list[bool]] = {}
    for ep in data.sample:
        cells.setdefault((ep.model, ep.budget, ep.reasoning), []).append(ep.is_truncated)
    assert len(cells) == 9
    for flags in cells.values():
        assert len(flags) <= report.PER_CELL
        assert flags == sorted(flags, reverse=True)
    at_64 = cells[("sim-alpha", 64, "none")]
    assert at_64[0]
    assert not at_64[-1]
    ids = [ep.episode_id for ep in data.sample]
    assert {e.episode_id for e in load_episodes(run, ids)} == set(ids)


def test_identity_and_check_verdict(run: Path, page: Path) -> None:
    """The run's identity block names the fingerprint, models, budgets, commits and the verdict."""
    data = report.collect(run)
    identity = dict(data.identity)
    assert identity["config fingerprint"] == "fp-report-test"
    assert identity["models"] == "sim-alpha, sim-think"
    assert identity["budgets"] == "64, 128, 256"
    assert identity["commits"] == "6"
    assert identity["episodes"] == "144"
    assert data.check_ok
    assert 'id="verdict">collector check: ok' in page.read_text(encoding="utf-8")


def test_stop_colours_are_the_notebooks() -> None:
    """A stop reason has the notebook's colour in the report too."""
    from collector.analysis import figures  # matplotlib (a dev dependency): imported here only

    assert figures.STOP_COLOURS == svgplot.STOP_COLOURS


def test_a_run_in_object_storage(run: Path, page: Path, s3_bucket: S3Bucket, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`collector report s3://...` reads the run through its mirror: the same table as locally,
    the URI as the run's name."""
    monkeypatch.setenv("COLLECTOR_CACHE_DIR", str(tmp_path / "cache"))
    for path in sorted(p for p in run.rglob("*") if p.is_file() and not p.name.endswith(".lock")):
        s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=f"runs/r/{path.relative_to(run).as_posix()}",
                                    Body=path.read_bytes())
    uri = s3_bucket.uri("runs/r")
    out = tmp_path / "s3.html"
    assert cli.main(["report", uri, "-o", str(out), "--target", "0.3"]) == 0
    text = out.read_text(encoding="utf-8")
    assert f"<td>run</td><td>{html.escape(uri)}</td>" in text
    table = text.split('<table id="stats"', 1)[1].split("</table>", 1)[0]
    local = page.read_text(encoding="utf-8").split('<table id="stats"', 1)[1].split("</table>", 1)[0]
    assert table == local


def test_budget_axis_ticks_exactly_the_budgets_and_draws_bands() -> None:
    """The log2 budget axis labels each swept budget (96 too) and nothing else; a band is a
    closed path under its line; a label from the run is escaped."""
    svg = svgplot.line_chart("t", "y", [64, 96, 192], [svgplot.Line(
        "<b>m</b>", "#123456", [(64, 0.5), (96, 0.25), (192, 0.0)], [(0.4, 0.6), (0.2, 0.3), (0.0, 0.1)])])
    ticks = list(re.findall(r'text-anchor="middle">(\d+)</text>', svg))
    assert ticks == ["64", "96", "192"]
    assert svg.count('class="data band"') == 1
    assert re.search(r'class="data band" d="M[^"]+Z"', svg)
    assert "<b>m</b>" not in svg
    assert "&lt;b&gt;m&lt;/b&gt;" in svg


def test_an_empty_run_still_has_a_page(tmp_path: Path) -> None:
    """A run with nothing committed yet: identity and verdict, no rows, no figures, no crash."""
    with LocalRunStore.open(tmp_path / "empty", "fp-empty", {}, "arrow", 16):
        pass
    text = report.build_report(tmp_path / "empty")
    assert "fp-empty" in text
    assert 'id="verdict"' in text
    assert '<svg class="figure"' not in text
    assert "<tbody></tbody>" in text


def test_cli_defaults_to_a_five_percent_target_and_never_writes_into_the_run(
        run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`collector report RUN -o OUT` picks for 5% (as `stats --target 0.05`); an OUT inside the
    run directory is refused with one line and exit code 2, and nothing is written there."""
    out = tmp_path / "default.html"
    assert cli.main(["report", str(run), "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "Smallest budget with truncation at or under 5.0%" in text
    picks = stats_json(run, "0.05")["picks"]
    table = text.split('<table id="picks"', 1)[1].split("</table>", 1)[0]
    assert table.count("<tr data-model=") == len(picks)  # type: ignore[arg-type]
    budgets = [p["budget"] for p in picks]  # type: ignore[index,union-attr]
    assert budgets == [256, 256, 128]
    assert [int(b) for b in re.findall(r"<td>(\d+) \(measured", table)] == budgets
    capsys.readouterr()
    assert cli.main(["report", str(run), "-o", str(run / "data" / "r.html")]) == 2
    assert "collector: error:" in capsys.readouterr().err
    assert not (run / "data" / "r.html").exists()
