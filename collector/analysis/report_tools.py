"""The report's per-tool and per-task parts: the tables of `collector stats --per tool` and
`--per task`, and per model the cumulative distribution of output tokens per turn and of
each tool's call size with the sweep's budgets marked (`collector.analysis.callsizes`).

Read with one pass over the columns they need (`collect_tools`), drawn as HTML by
`tools_section` (tables) and `size_figure` (one inline SVG per model), so the report's own
modules only call these two.

Tests: tests/analysis/test_callsizes.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from collector.analysis.callsizes import ALL_TURNS, SizeCurve, size_curves
from collector.analysis.committed import read_columns
from collector.analysis.svgplot import DASHES, MODEL_COLOURS, Line, cdf_chart, esc
from collector.analysis.taskstats import TaskStatsResult, aggregate_tasks
from collector.analysis.toolstats import ToolStatsResult, aggregate_tools, budget_lines

__all__ = ["ToolReport", "collect_tools", "size_figure", "tools_section"]

#: Clustered tasks listed at most (the rest are counted): the page stays bounded.
MAX_TASK_ROWS = 50


@dataclass(slots=True)
class ToolReport:
    tools: ToolStatsResult
    tasks: TaskStatsResult
    curves: list[SizeCurve]


def collect_tools(root: str | Path, by: Sequence[str], target: float | None) -> ToolReport:
    """The per-tool table (with budgets when `target`), the per-task table and the size curves."""
    by = tuple(by) if "budget" in by else (*by, "budget")
    table = read_columns(root, sorted({*by, "task_id", "stop_reason", "is_truncated", "turns", "messages"}))
    model_by = [c for c in by if c != "budget"]
    tools = aggregate_tools(table, by, target)
    return ToolReport(tools=tools, tasks=aggregate_tasks(table, by),
                      curves=size_curves(table, model_by, tools))


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def _cells(values: Sequence[object]) -> str:
    return "".join(f"<td>{esc(v)}</td>" for v in values)


def tools_section(report: ToolReport | None) -> str:
    """The per-tool table and budgets, then the tasks cut far more than their cell."""
    if report is None:
        return ""
    tools = report.tools
    head = "".join(f"<th>{esc(h)}</th>" for h in (*tools.by, "tool", "calls", "cut", "95% CI", "malformed",
                                                   "tokens p50", "p90", "p99", "max"))
    rows = []
    for g in tools.groups:
        d = g.as_dict()
        low, high = g.truncation_interval
        ci = "-" if math.isnan(low) else f"[{100 * low:.1f}, {100 * high:.1f}]"
        sizes = ["-" if math.isnan(d[k]) else int(d[k]) for k in ("tokens_p50", "tokens_p90", "tokens_p99",
                                                                    "tokens_max")]
        cells = [*(g.key[c] for c in tools.by), g.key["tool"], g.calls, _pct(g.truncation_rate), ci,
                 g.malformed, *sizes]
        rows.append(f'<tr data-model="{esc(g.key.get("model"))}">{_cells(cells)}</tr>')
    unknown = sum(n for _, n in tools.unattributed)
    answers = budget_lines(tools.budgets, tools.target) if tools.target is not None else []
    answer_html = "".join(f"<li>{esc(line.strip())}</li>" for line in answers[1:])
    out = [f'<h2>Calls per tool</h2><p class="muted">cut: the cut turn was writing a call to this tool (its '
           f"name arrives before its arguments); {unknown} cut turn(s) showed no call and are not counted to "
           "any tool. tokens: output tokens of the turn of each complete call.</p>",
           f'<div class="wide"><table id="tools"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}'
           "</tbody></table></div>"]
    if answers:
        out.append(f"<p>{esc(answers[0])}</p><ul id=tool-budgets>{answer_html}</ul>")
    clustered = report.tasks.clustered()
    task_rows = []
    for r in clustered[:MAX_TASK_ROWS]:
        low, high = r.truncation_interval
        cells = [*(r.key[c] for c in report.tasks.by), r.key["task_id"], r.episodes, _pct(r.truncation_rate),
                 f"[{100 * low:.1f}, {100 * high:.1f}]", _pct(r.cell_rate)]
        task_rows.append(f'<tr data-model="{esc(r.key.get("model"))}">{_cells(cells)}</tr>')
    more = f" (the first {MAX_TASK_ROWS} shown)" if len(clustered) > MAX_TASK_ROWS else ""
    task_head = "".join(f"<th>{esc(h)}</th>" for h in (*report.tasks.by, "task", "episodes", "truncated",
                                                        "95% CI", "cell"))
    out.append(f'<h2>Tasks cut far more than their cell</h2><p class="muted">{len(clustered)} task row(s) '
               f"whose 95% lower bound is above their cell's rate{more}; "
               "<code>collector stats --per task --format csv</code> lists every task.</p>")
    if task_rows:
        out.append(f'<div class="wide"><table id="tasks"><thead><tr>{task_head}</tr></thead>'
                   f'<tbody>{"".join(task_rows)}</tbody></table></div>')
    return "".join(out)


def size_figure(report: ToolReport | None, model: str, colour: str) -> str:
    """The model's cumulative distributions: every turn's output tokens (the model's colour)
    and each tool's call size, against tokens, each swept budget a vertical rule."""
    if report is None:
        return ""
    curves = [c for c in report.curves if c.key.get("model") == model]
    if not curves:
        return ""
    lines = []
    for i, c in enumerate(curves):
        rest = ", ".join(str(v) for k, v in c.key.items() if k != "model")
        label = c.series + (f" [{rest}]" if rest else "")
        if c.series == ALL_TURNS:
            lines.append(Line(label, colour, c.points, dash=DASHES[0]))
        else:
            lines.append(Line(label, MODEL_COLOURS[(i + 3) % len(MODEL_COLOURS)], c.points,
                              dash=DASHES[1 + i % (len(DASHES) - 1)]))
    budgets = sorted({b for c in curves for b in c.budgets})
    return cdf_chart("Output tokens per turn and per tool call",
                     "output tokens (cut ones: more than the cap)", budgets, lines)
