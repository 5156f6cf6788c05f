"""Small inline-SVG charts for `collector report`: lines with interval bands, stacked bars.

Why not matplotlib: the report must be one self-contained page written in seconds by the
base install (matplotlib is the `analysis` extra and takes longer to import than the whole
report takes to build). The conventions are those of `collector.analysis.figures`: the
budget axis is log2 with a labelled tick at every budget swept and no other; a stop reason
has one colour everywhere (`collector.analysis.colours`, shared with the notebook's figures).

Every data mark is a ``<path class="data">`` (the browser test counts them); every label
passes through `html.escape`, since model names and error types come from the run.

Tests: tests/analysis/test_report.py.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from collector.analysis.colours import MODEL_COLOURS, STOP_COLOURS, stop_colour

__all__ = ["MODEL_COLOURS", "STOP_COLOURS", "Bar", "Line", "bar_chart", "cdf_chart", "esc", "line_chart",
           "step_value", "stop_colour"]

#: Stroke patterns that tell apart the lines of one model (settings, turn kinds).
DASHES = ("", "6 3", "2 3", "8 3 2 3")

_W, _H = 420, 240
_LEFT, _RIGHT, _TOP, _BOTTOM = 52, 12, 26, 58


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


@dataclass(slots=True)
class Line:
    """One series against budget; `band` is (low, high) per point (NaN: none there)."""

    label: str
    colour: str
    points: list[tuple[int, float]]
    band: list[tuple[float, float]] | None = None
    dash: str = ""
    stars: list[tuple[int, float]] = field(default_factory=list)
    """Points marked with a star (the budget picked for the target)."""


@dataclass(slots=True)
class Bar:
    """One stacked segment series: a label, its colour, a value per category."""

    label: str
    colour: str
    values: list[float]


def _fmt(x: float) -> str:
    return f"{x:.1f}"


def _ticks(top: float) -> list[float]:
    if top <= 0:
        return [0.0]
    raw = top / 4
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(top / step + 1e-9) + 1)]


def _tick_label(v: float, percent: bool) -> str:
    if percent:
        return f"{100 * v:.0f}%"
    return f"{v:g}" if abs(v) < 1e4 else f"{v:.2g}"


def _frame(title: str, ylabel: str, top: float, percent: bool) -> tuple[list[str], float, float]:
    """The SVG head, title, y grid and labels; returns the parts and the plot's width and height."""
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    out = [f'<svg class="figure" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" '
           f'width="{_W}" height="{_H}" role="img" aria-label="{esc(title)}">',
           f'<text x="{_W / 2}" y="16" text-anchor="middle" class="t">{esc(title)}</text>']
    for v in _ticks(top):
        y = _TOP + ph - (v / top if top else 0) * ph
        out.append(f'<path class="grid" d="M{_LEFT} {_fmt(y)}H{_LEFT + pw}"/>')
        out.append(f'<text x="{_LEFT - 4}" y="{_fmt(y + 3)}" text-anchor="end">'
                   f"{_tick_label(v, percent)}</text>")
    out.append(f'<path class="axis" d="M{_LEFT} {_TOP}V{_TOP + ph}H{_LEFT + pw}"/>')
    out.append(f'<text transform="translate(12 {_TOP + ph / 2}) rotate(-90)" text-anchor="middle">'
               f'{esc(ylabel)}</text>')
    return out, pw, ph


def _legend(entries: Sequence[tuple[str, str, str]], y0: float) -> list[str]:
    """Legend rows under the plot: (label, colour, dash) each, flowing left to right."""
    out, x, y = [], float(_LEFT), y0
    for label, colour, dash in entries:
        width = 26 + 6 * len(label)
        if x + width > _W and x > _LEFT:
            x, y = float(_LEFT), y + 12
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<path class="key" d="M{_fmt(x)} {_fmt(y - 3)}h16" stroke="{colour}"{dash_attr}/>')
        out.append(f'<text x="{_fmt(x + 19)}" y="{_fmt(y)}">{esc(label)}</text>')
        x += width
    return out


def _polyline(ln: Line, xy: Sequence[tuple[float, float]]) -> str:
    """A series' line through points already in the plot's coordinates, named by its label."""
    dash = f' stroke-dasharray="{ln.dash}"' if ln.dash else ""
    d = "M" + " L".join(f"{_fmt(px)} {_fmt(py)}" for px, py in xy)
    return f'<path class="data line" d="{d}" stroke="{ln.colour}"{dash}><title>{esc(ln.label)}</title></path>'


def line_chart(title: str, ylabel: str, budgets: Sequence[int], lines: Sequence[Line], *,
               top: float | None = None, percent: bool = True, hline: float | None = None) -> str:
    """Series against a log2 budget axis, bands drawn under their lines, `hline` dashed."""
    ticks = sorted({int(b) for b in budgets})
    values = [v for ln in lines for _, v in ln.points if not math.isnan(v)]
    values += [h for ln in lines for _, h in (ln.band or []) if not math.isnan(h)]
    if top is None:
        top = max([*values, hline or 0.0, 1e-9]) * 1.1
    out, pw, ph = _frame(title, ylabel, top, percent)
    lo, hi = (math.log2(ticks[0]), math.log2(ticks[-1])) if ticks else (0.0, 1.0)

    def x(b: float) -> float:
        return _LEFT + (pw / 2 if hi == lo else (math.log2(b) - lo) / (hi - lo) * pw)

    def y(v: float) -> float:
        return _TOP + ph - min(max(v / top, 0.0), 1.0) * ph

    for b in ticks:
        out.append(f'<path class="axis" d="M{_fmt(x(b))} {_TOP + ph}v4"/>')
        out.append(f'<text x="{_fmt(x(b))}" y="{_TOP + ph + 14}" text-anchor="middle">{b}</text>')
    out.append(f'<text x="{_LEFT + pw / 2}" y="{_TOP + ph + 27}" text-anchor="middle">'
               "output-token budget per turn</text>")
    if hline is not None:
        out.append(f'<path class="target" d="M{_LEFT} {_fmt(y(hline))}H{_LEFT + pw}"/>')
    for ln in lines:
        if ln.band:
            spans = [(b, lo_, hi_) for (b, _), (lo_, hi_) in zip(ln.points, ln.band, strict=True)
                     if not math.isnan(lo_)]
            if spans:
                upper = " L".join(f"{_fmt(x(b))} {_fmt(y(h))}" for b, _, h in spans)
                lower = " L".join(f"{_fmt(x(b))} {_fmt(y(low))}" for b, low, _ in reversed(spans))
                out.append(f'<path class="data band" d="M{upper} L{lower}Z" fill="{ln.colour}"/>')
    for ln in lines:
        pts = [(b, v) for b, v in ln.points if not math.isnan(v)]
        if not pts:
            continue
        out.append(_polyline(ln, [(x(b), y(v)) for b, v in pts]))
        for b, v in pts:
            out.append(f'<circle cx="{_fmt(x(b))}" cy="{_fmt(y(v))}" r="2.5" fill="{ln.colour}">'
                       f"<title>{esc(ln.label)} at {b}: {_tick_label(v, percent) if percent else f'{v:.4g}'}"
                       "</title></circle>")
        for b, v in ln.stars:
            cx, cy = x(b), y(v)
            star = " L".join(f"{_fmt(cx + r * math.sin(a))} {_fmt(cy - r * math.cos(a))}"
                             for i in range(10) for a, r in [(i * math.pi / 5, 8 if i % 2 == 0 else 3.5)])
            out.append(f'<path class="data star" d="M{star}Z" fill="{ln.colour}">'
                       f"<title>{esc(ln.label)}: picked {b}</title></path>")
    keys = [(ln.label, ln.colour, ln.dash) for ln in lines]
    if hline is not None:
        keys.append((f"target {100 * hline:g}%", "#555", "4 3"))
    out += _legend(keys, _TOP + ph + 42)
    out.append("</svg>")
    return "".join(out)


def bar_chart(title: str, ylabel: str, categories: Sequence[str], bars: Sequence[Bar], *,
              top: float | None = None, percent: bool = False) -> str:
    """Stacked bars, one per category (a budget, or a budget and setting), segments in order."""
    totals = [sum(b.values[i] for b in bars) for i in range(len(categories))]
    if top is None:
        top = max([*totals, 1e-9]) * 1.1
    out, pw, ph = _frame(title, ylabel, top, percent)
    n = max(len(categories), 1)
    slot = pw / n
    width = slot * 0.7
    for i, cat in enumerate(categories):
        x0 = _LEFT + i * slot + (slot - width) / 2
        base = 0.0
        for b in bars:
            v = b.values[i]
            if v <= 0:
                continue
            y1 = _TOP + ph - min((base + v) / top, 1.0) * ph
            y0 = _TOP + ph - min(base / top, 1.0) * ph
            shown = f"{100 * v:.1f}%" if percent else f"{v:g}"
            out.append(f'<path class="data bar" d="M{_fmt(x0)} {_fmt(y0)}V{_fmt(y1)}h{_fmt(width)}'
                       f'V{_fmt(y0)}Z" fill="{b.colour}"><title>{esc(cat)}: {esc(b.label)} {shown}'
                       "</title></path>")
            base += v
        # "64 effort=high": the budget on the first line, the rest under it (bars are narrow).
        first, _, rest = cat.partition(" ")
        out.append(f'<text x="{_fmt(x0 + width / 2)}" y="{_TOP + ph + 12}" text-anchor="middle">'
                   f"{esc(first)}</text>")
        if rest:
            out.append(f'<text x="{_fmt(x0 + width / 2)}" y="{_TOP + ph + 22}" text-anchor="middle" '
                       f'class="small">{esc(rest)}</text>')
    out += _legend([(b.label, b.colour, "") for b in bars], _TOP + ph + 36)
    out.append("</svg>")
    return "".join(out)


def step_value(points: Sequence[tuple[int, float]], t: float) -> float:
    """The value at `t` of a step function given as ascending (x, value) points (NaN before the first)."""
    value = math.nan
    for x, v in points:
        if x > t:
            break
        value = v
    return value


def cdf_chart(title: str, xlabel: str, budgets: Sequence[int], lines: Sequence[Line], *,
              samples: int = 160) -> str:
    """Cumulative shares (0 to 1) against tokens on a log2 axis, each swept budget ticked and
    marked by a vertical rule. A `Line`'s points are its step function's corners; it is drawn
    at `samples` log-spaced positions (and at every budget), so the page stays small."""
    ticks = sorted({int(b) for b in budgets})
    firsts = [ln.points[0][0] for ln in lines if ln.points]
    hi = float(max([*ticks, 2]))
    lo = float(max(1, min([*firsts, *ticks[:1], int(hi)])))
    lo = min(lo, hi / 2)
    out, pw, ph = _frame(title, "share needing at most this many", 1.0, True)

    def x(t: float) -> float:
        return _LEFT + (math.log2(t) - math.log2(lo)) / (math.log2(hi) - math.log2(lo)) * pw

    def y(v: float) -> float:
        return _TOP + ph - min(max(v, 0.0), 1.0) * ph

    for b in ticks:
        out.append(f'<path class="target" d="M{_fmt(x(b))} {_TOP}V{_TOP + ph}"/>')
        out.append(f'<text x="{_fmt(x(b))}" y="{_TOP + ph + 14}" text-anchor="middle">{b}</text>')
    out.append(f'<text x="{_LEFT + pw / 2}" y="{_TOP + ph + 27}" text-anchor="middle">{esc(xlabel)}</text>')
    grid = sorted({*(lo * (hi / lo) ** (i / (samples - 1)) for i in range(samples)), *map(float, ticks)})
    for ln in lines:
        pts = [(t, step_value(ln.points, t)) for t in grid]
        pts = [(t, v) for t, v in pts if not math.isnan(v)]
        if not pts:
            continue
        out.append(_polyline(ln, [(x(t), y(v)) for t, v in pts]))
        for b in ticks:
            v = step_value(ln.points, b - 1)
            if not math.isnan(v):
                out.append(f'<circle cx="{_fmt(x(b))}" cy="{_fmt(y(v))}" r="2.5" fill="{ln.colour}">'
                           f"<title>{esc(ln.label)}: {100 * v:.1f}% fit budget {b}</title></circle>")
    out += _legend([(ln.label, ln.colour, ln.dash) for ln in lines], _TOP + ph + 42)
    out.append("</svg>")
    return "".join(out)
