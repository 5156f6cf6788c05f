"""`collector report A B`: run A's page with run B beside it, cell by cell.

A section after A's truncation table: for every (model, budget) cell of either run (and the
other grouping columns the two share), episodes, truncation rate with its Wilson 95% interval,
error rate and mean reward of A and of B, and the change in truncation. A change whose two
intervals do not overlap is marked: the runs differ there beyond sampling noise. A cell that
only one run has shows a dash for the other. Both runs are read with `collector stats`'s own
numbers (`compute_stats`), never re-counted here.

Tests: tests/analysis/test_report_views.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collector.analysis.stats import compute_stats, format_stats
from collector.analysis.svgplot import esc
from collector.storage.mirror import resolve_run

__all__ = ["comparison_section"]


def _rows(run: str | Path, target: float | None, by: tuple[str, ...] = ()
          ) -> tuple[list[str], dict[tuple[Any, ...], dict[str, Any]]]:
    import json

    data = json.loads(format_stats(compute_stats(resolve_run(run), by=by, target=target), "json"))
    columns = [str(c) for c in data["by"]]
    return columns, {tuple(r[c] for c in columns): r for r in data["rows"]}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _interval(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    return f"{_pct(row['truncation_rate'])} [{_pct(row['trunc_low'])}, {_pct(row['trunc_high'])}]"


def comparison_section(run_a: str | Path, run_b: str | Path, name_a: str, name_b: str,
                       target: float | None) -> str:
    """The HTML section comparing run A (this page's run) with run B."""
    by_a, rows_a = _rows(run_a, target)
    by_b, rows_b = _rows(run_b, target)
    if by_a != by_b:  # grouped differently (one run has several providers): model x budget
        by_a, rows_a = _rows(run_a, target, ("model", "budget"))
        by_b, rows_b = _rows(run_b, target, ("model", "budget"))
    keys = sorted(set(rows_a) | set(rows_b), key=_order)
    body = []
    for key in keys:
        a, b = rows_a.get(key), rows_b.get(key)
        change, mark = "-", ""
        if a and b and a["truncation_rate"] is not None and b["truncation_rate"] is not None:
            delta = b["truncation_rate"] - a["truncation_rate"]
            change = f"{delta:+.1%}"
            apart = b["trunc_low"] > a["trunc_high"] or a["trunc_low"] > b["trunc_high"]
            mark = ' class="pick"' if apart else ""
        cells = "".join(f'<td class="k">{esc(str(v))}</td>' for v in key)
        for row in (a, b):
            reward = "-" if row is None or row["mean_reward"] is None else f"{row['mean_reward']:.3f}"
            cells += (f"<td>{'-' if row is None else row['episodes']}</td><td>{_interval(row)}</td>"
                      f"<td>{'-' if row is None else _pct(row['error_rate'])}</td><td>{reward}</td>")
        body.append(f"<tr{mark}>{cells}<td>{change}</td></tr>")
    head = "".join(f'<th class="k">{esc(c)}</th>' for c in by_a)
    per_run = "".join(f"<th>{run} {what}</th>" for run in "AB"
                      for what in ("episodes", "truncation [95%]", "error", "reward"))
    return (f'<h2 id="compare">Compared with {esc(name_b)}</h2>'
            f'<p class="muted">A: {esc(name_a)} (this page). B: {esc(name_b)}. Highlighted: the two '
            "truncation intervals do not overlap (a difference beyond sampling noise).</p>"
            f'<div class="wide"><table id="comparison"><thead><tr>{head}{per_run}'
            f'<th>truncation B - A</th></tr></thead><tbody>{"".join(body)}</tbody></table></div>')


def _order(key: tuple[Any, ...]) -> tuple[tuple[int, str, float], ...]:
    """Cells in `collector stats`' order: names alphabetically, budgets by number."""
    return tuple((0, "", float(v)) if isinstance(v, int | float) else (1, str(v), 0.0) for v in key)
