"""`collector report` (`collector.analysis.report`): the numbers against `collector stats --format
json`, escaping of model output, the sample. The page in a real headless Chromium:
tests/system/analysis/test_report_browser.py.
"""

from __future__ import annotations

import contextlib
import html
import io
import json
import re
from pathlib import Path

import pytest

from collector import cli
from collector.analysis import report, svgplot
from collector.analysis.episodes import load_episodes
from collector.storage.local import LocalRunStore
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


def stats_json(run: Path, target: str) -> dict[str, object]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["stats", str(run), "--format", "json", "--target", target]) == 0
    payload: dict[str, object] = json.loads(out.getvalue())
    return payload


_CELLS = """Array.from(document.querySelectorAll('#stats tbody tr')).map(tr =>
  Object.fromEntries(Array.from(tr.cells).map(td => [td.dataset.key, JSON.parse(td.dataset.value)])))"""
_SHOWN = "Array.from(document.querySelectorAll('details.ep')).filter(e => e.offsetParent !== null).length"

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
