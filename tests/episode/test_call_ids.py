"""Duplicate call ids inside one turn: the repeat is not run, and gets an id of its own in the replay."""

from __future__ import annotations

from collector.providers.scripted import call, calls, text
from collector.turn import AssistantMessage
from tests.episode.helpers import ToyEnv, run

REFUND = {"order_id": "A-1", "amount": 5.0}


async def test_a_call_repeating_an_earlier_id_is_not_run_and_gets_its_own_id() -> None:
    """The first call with an id runs; a later one with the same id is answered as an error and renamed."""
    turn = calls(
        call("refund", REFUND, id="x"),
        call("close_tickets", {"customer_id": "C-1"}, id="x"),
        call("refund", REFUND, id="x"),
    )
    env = ToyEnv()
    ep, provider, _ = await run([turn, text("done")], env=env, stop_on=[])
    assert env.log == [("refund", REFUND)]
    assert [e.call_id for e in ep.executed_tool_calls] == ["x"]
    stored = next(m for m in ep.messages if m.role == "assistant")
    assert [c.id for c in stored.tool_calls] == ["x", "x_dup1", "x_dup2"]
    results = [m for m in ep.messages if m.role == "tool"]
    assert [(m.call_id, m.is_error) for m in results] == [("x", False), ("x_dup1", True), ("x_dup2", True)]
    assert "repeated the id 'x'" in results[1].text
    replayed = next(m for m in provider.requests[1].messages if isinstance(m, AssistantMessage))
    assert [c.id for c in replayed.tool_calls] == ["x", "x_dup1", "x_dup2"]
    assert ep.tool_errors == 2


async def test_a_renamed_id_never_collides_with_another_call_of_the_turn() -> None:
    """When `x_dup1` is already taken by a call of the turn, the repeat gets the next free suffix."""
    turn = calls(
        call("refund", REFUND, id="x"),
        call("refund", REFUND, id="x"),
        call("close_tickets", {"customer_id": "C-1"}, id="x_dup1"),
    )
    env = ToyEnv()
    ep, _, _ = await run([turn, text("done")], env=env, stop_on=[])
    stored = next(m for m in ep.messages if m.role == "assistant")
    assert [c.id for c in stored.tool_calls] == ["x", "x_dup2", "x_dup1"]
    assert [name for name, _ in env.log] == ["refund", "close_tickets"]


async def test_a_repeated_gate_call_holds_its_siblings() -> None:
    """A gate call that repeats an id holds every sibling, as a malformed gate call does: nothing runs."""
    turn = calls(
        call("approve", {"order_id": "A-1"}, id="g"),
        call("approve", {"order_id": "A-1"}, id="g"),
        call("refund", REFUND, id="r"),
    )
    env = ToyEnv()
    ep, _, _ = await run([turn, text("done")], env=env, stop_on=[])
    assert env.log == []
    held = [m for m in ep.messages if m.role == "tool" and m.call_id in ("g", "r")]
    assert [m.is_error for m in held] == [True, True]
    assert all("nothing was approved" in m.text for m in held)
