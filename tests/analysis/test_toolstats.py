"""The per-tool table and the card's statements over hand-built episodes whose counts are known:
a cut call counted to the tool it was writing, a cut turn without a call counted apart,
malformed calls of uncut turns, the sizes of complete calls only, and a card that says so
when a call from a cut turn did run."""

from __future__ import annotations

from pathlib import Path

from collector.analysis.card import card_lines, check_card
from collector.analysis.toolstats import compute_tool_stats, format_tool_stats
from collector.record.episode import ExecutedToolCall
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from tests.record.factory import make_batch, make_episode

S = StopReason


def _run(path: Path, *extra: object) -> Path:
    episodes = make_batch(20, budget=128, stops=(S.DONE, S.LENGTH, S.MALFORMED_TOOL_CALL, S.ERROR))
    with LocalRunStore.open(path, "fp", {}, "arrow", 64) as store:
        store.commit([*episodes, *extra])  # type: ignore[list-item]
    return path


def test_counts_per_tool_from_known_episodes(tmp_path: Path) -> None:
    """Calls, cut calls, malformed calls and complete sizes per tool are exactly those the episodes hold."""
    uncalled = make_episode(S.LENGTH, budget=128, task="t-answer")
    for m in uncalled.messages:
        if m.turn_index == 1:
            m.tool_calls = []  # a cut turn that showed no call: its tool cannot be known
    result = compute_tool_stats(_run(tmp_path / "run", uncalled))
    [row] = result.groups
    assert row.key == {"model": "sim-perfect", "budget": 128, "tool": "calculator"}
    # 21 first turns and 5 malformed second turns complete; 5 cut second turns were writing a call.
    assert (row.calls, row.cut, row.malformed) == (31, 5, 5)
    assert row.sizes == sorted([30] * 21 + [20] * 5)
    assert result.unattributed == [({"model": "sim-perfect", "budget": 128}, 1)]
    text = format_tool_stats(result)
    assert "cut turns with no recorded call" in text
    assert "sim-perfect, 128: 1" in text


def test_card_says_when_a_call_from_a_cut_turn_ran(tmp_path: Path) -> None:
    """A call executed from a cut turn turns the card's statement around, and a card denying it fails."""
    clean = _run(tmp_path / "clean")
    denial = next(text for text, key in card_lines(clean) if key == "cut_not_executed")
    assert denial.startswith("- No tool call from a cut turn was executed: 0 of the 20 executed calls")
    leaked = make_episode(S.LENGTH, budget=128, task="t-leak")
    leaked.executed_tool_calls.append(ExecutedToolCall(turn_index=1, call_id="call_2", name="calculator",
                                                       arguments_json="{}", is_error=False))
    run = _run(tmp_path / "leaked", leaked)
    admitted = next(text for text, key in card_lines(run) if key == "cut_not_executed")
    assert admitted.startswith("- A tool call from a cut turn WAS executed: 1 of the 22 executed calls")
    card = tmp_path / "README.md"
    lines = [text for text, _ in card_lines(run)]
    card.write_text("\n".join(denial if "claim:cut_not_executed" in t else t for t in lines) + "\n")
    problems = check_card(run, card).problems
    assert len(problems) == 1
    assert "claim cut_not_executed does not hold" in problems[0]
