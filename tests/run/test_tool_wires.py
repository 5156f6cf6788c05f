"""A cut call's tool is known on every wire that keeps a cut call, and counted apart on Gemini.

The same seeded support-desk sweep of `sim-tools` (no text before a call, so every cut lands
inside a call) over the four wire formats, streamed: Chat Completions, Responses and
Anthropic send the tool's name before its arguments, so the per-tool rows are the same on
all three and no cut turn is left without a tool; Gemini drops a call the cap left open, so
no call is counted cut there, and every e-mail turn is either a complete call or a cut turn
whose tool cannot be known (its draws differ: the simulator seeds a reply by its request).
"""

from __future__ import annotations

import pytest

from collector.analysis.toolstats import ToolStatsResult, compute_tool_stats
from collector.run.job import run_job
from tests.run.helpers import small_config
from tests.untraced import untraced

WIRES = ("chat", "responses", "anthropic", "gemini")


@pytest.fixture(scope="module")
def per_wire(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ToolStatsResult]:
    root = tmp_path_factory.mktemp("wires")
    out = {}
    for wire in WIRES:
        cfg = small_config(root / wire, sweep__models=["sim-tools"], sweep__budgets=[64, 160],
                           env__name="support_desk", env__tasks=10, samples_per_task=4,
                           provider__sim_transport=wire, provider__streaming=True)
        with untraced():  # samples over lines the other tests cover (tests/untraced.py)
            run_job(cfg, show_progress=False)
        out[wire] = compute_tool_stats(root / wire)
    return out


def _rows(result: ToolStatsResult) -> list[tuple[object, ...]]:
    return [(g.key["budget"], g.key["tool"], g.calls, g.cut) for g in result.groups]


def test_cut_calls_are_attributed_alike_on_every_wire_that_keeps_them(
    per_wire: dict[str, ToolStatsResult],
) -> None:
    """Chat, Responses and Anthropic give the same per-tool rows, with cuts, and no unknown cut turn."""
    chat = _rows(per_wire["chat"])
    assert any(cut for *_, cut in chat)
    for wire in ("chat", "responses", "anthropic"):
        assert _rows(per_wire[wire]) == chat, wire
        assert per_wire[wire].unattributed == [], wire


def test_gemini_cuts_are_counted_apart_not_guessed(per_wire: dict[str, ToolStatsResult]) -> None:
    """On Gemini no call is counted cut; the e-mail turns not complete are the unknown cut turns."""
    gemini = per_wire["gemini"]
    assert all(g.cut == 0 for g in gemini.groups)
    unknown = {key["budget"]: n for key, n in gemini.unattributed}
    assert unknown[64] > 0
    for budget in (64, 160):
        emails = next(g.calls for g in per_wire["chat"].groups
                      if g.key["tool"] == "send_email" and g.key["budget"] == budget)
        complete = sum(g.calls for g in gemini.groups
                       if g.key["tool"] == "send_email" and g.key["budget"] == budget)
        assert complete + unknown.get(budget, 0) == emails
