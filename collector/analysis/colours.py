"""The colours of every picture of a run: one per stop reason, one per model.

Shared by the notebook's matplotlib figures (`collector.analysis.figures`) and the report's
inline SVG (`collector.analysis.svgplot`), so a stop reason has the same colour in both;
kept apart because `figures` imports matplotlib at load and the report must not.

Tests: tests/analysis/test_figures.py, tests/analysis/test_report.py.
"""

from __future__ import annotations

from collector.stop import StopReason

__all__ = ["MODEL_COLOURS", "OTHER_COLOUR", "STOP_COLOURS", "stop_colour"]

#: One colour per stop reason, fixed: outcomes green/blue, the stop_on reasons warm, failures grey.
STOP_COLOURS: dict[str, str] = {
    StopReason.DONE.value: "#2ca02c",
    StopReason.MAX_STEPS.value: "#1f77b4",
    StopReason.LENGTH.value: "#ff7f0e",
    StopReason.CONTEXT_OVERFLOW.value: "#e377c2",
    StopReason.MALFORMED_TOOL_CALL.value: "#d62728",
    StopReason.TIMEOUT.value: "#9467bd",
    StopReason.ERROR.value: "#7f7f7f",
}
#: Reasons not in the enum (a newer collector's): drawn in this colour, after the known ones.
OTHER_COLOUR = "#17becf"
#: Models take matplotlib's tab10 colours in name order (fixed within a run).
MODEL_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                 "#7f7f7f", "#bcbd22", "#17becf")


def stop_colour(reason: str) -> str:
    return STOP_COLOURS.get(reason, OTHER_COLOUR)
