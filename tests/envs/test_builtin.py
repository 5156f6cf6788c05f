"""The built-in environments: task phrasings, tools and grading from the final state."""

from __future__ import annotations

import json
import re

import pytest

from collector.envs.arithmetic import ArithmeticEnv, evaluate
from collector.envs.base import Task
from collector.envs.support_desk import SupportDeskEnv, SupportDeskWorld
from collector.envs.toolkit import run_tool


def _tool(world: SupportDeskWorld, name: str):  # type: ignore[no-untyped-def]
    return next(t for t in world.tools if t.name == name)


def test_arithmetic_tasks_match_the_shared_phrasing_and_grade_on_the_last_number() -> None:
    """Prompts follow the shared template; the grade reads the final answer's last number."""
    env = ArithmeticEnv(num_tasks=20, seed=3)
    pattern = re.compile(
        r"What is ([0-9][0-9+\-* ]*[0-9])\? Use the calculator tool, then reply with the number only\."
    )
    for task in env.tasks():
        match = pattern.fullmatch(str(task.prompt))
        assert match
        assert 2 <= len(match.group(1).split()) // 2 + 1 <= 4
        world = env.start(task)
        answer = task.metadata["answer"]
        assert world.grade(f"The result is {answer}") == 1.0
        assert world.grade(f"{answer} or {answer + 1}") == 0.0
        assert world.grade(None) == 0.0
    assert [t.id for t in env.tasks()] == [t.id for t in ArithmeticEnv(num_tasks=20, seed=3).tasks()]


async def test_calculator_evaluates_safely() -> None:
    """The calculator evaluates + - * on integers and refuses anything else as an error result."""
    assert evaluate("37 * 12 + 5") == 449
    assert evaluate("-(2 - 5) * 3") == 9
    world = ArithmeticEnv(num_tasks=1).start(Task("x", "What is 1 + 2? Use the calculator tool"))
    calc = world.tools[0]
    assert (await run_tool(calc, {"expression": "37 * 12 + 5"}, 1)).content == "449"
    for bad in ("__import__('os')", "2 ** 99", "1 / 2", "9" * 30, "x"):
        assert (await run_tool(calc, {"expression": bad}, 1)).is_error, bad


def test_support_desk_cycles_through_the_five_kinds() -> None:
    """Tasks cover refund, close, email, approval and lookup with the shared phrasings."""
    tasks = SupportDeskEnv(num_tasks=10).tasks()
    assert [t.metadata["kind"] for t in tasks[:5]] == ["refund", "close", "email", "approval", "lookup"]
    email = tasks[2]
    assert 100 <= len(email.metadata["body"]) <= 602
    assert str(email.prompt).startswith(f'Email {email.metadata["to"]} with the subject "')
    assert tasks[3].metadata["amount"] > 500


async def _run(world: SupportDeskWorld, name: str, **args: object) -> str:
    outcome = await run_tool(_tool(world, name), dict(args), 1.0)
    return outcome.content


async def test_refund_grading_needs_exactly_the_right_amount() -> None:
    """The refund task grades 1 only for the full amount on the right order, and nothing else."""
    env = SupportDeskEnv(num_tasks=5)
    task = env.tasks()[0]
    p = task.metadata
    world = env.start(task)
    await _run(world, "refund", order_id=p["order_id"], amount=10)
    assert world.grade("done") == 0.0  # the seed: 10 instead of the full amount
    world = env.start(task)
    await _run(world, "refund", order_id=p["order_id"], amount=p["amount"])
    assert world.grade("done") == 1.0
    await _run(world, "send_email", to="a@b", subject="s", body="b")
    assert world.grade("done") == 0.0


async def test_close_tickets_default_call_closes_everything_and_fails_the_grade() -> None:
    """The all-optional close_tickets closes every ticket when called with defaults: grade 0."""
    env = SupportDeskEnv(num_tasks=5)
    task = env.tasks()[1]
    world = env.start(task)
    total = len(world.tickets)
    assert await _run(world, "close_tickets") == f"closed {total} tickets"
    assert world.grade("done") == 0.0
    world = env.start(task)
    await _run(
        world,
        "close_tickets",
        customer_id=task.metadata["customer_id"],
        older_than_days=task.metadata["days"],
    )
    assert world.grade("done") == 1.0
    assert any(t.open for t in world.tickets if t.customer_id == task.metadata["customer_id"])


async def test_email_approval_and_lookup_grading() -> None:
    """Email needs exact fields; approval needs the gate before the refund; lookup needs the status."""
    env = SupportDeskEnv(num_tasks=5)
    email, approval, lookup = env.tasks()[2], env.tasks()[3], env.tasks()[4]
    world = env.start(email)
    p = email.metadata
    await _run(world, "send_email", to=p["to"], subject=p["subject"], body=p["body"][:-3])
    assert world.grade("sent") == 0.0
    world = env.start(email)
    await _run(world, "send_email", to=p["to"], subject=p["subject"], body=p["body"])
    assert world.grade("sent") == 1.0

    p = approval.metadata
    world = env.start(approval)
    await _run(world, "refund", order_id=p["order_id"], amount=p["amount"])
    assert world.grade("ok") == 0.0  # refunded without approval
    world = env.start(approval)
    assert (
        await _run(
            world, "request_approval", action="refund", order_id=p["order_id"], reason="refund over 500"
        )
        == "approved"
    )
    await _run(world, "refund", order_id=p["order_id"], amount=p["amount"])
    assert world.grade("ok") == 1.0
    assert _tool(world, "request_approval").gate

    world = env.start(lookup)
    result = json.loads(await _run(world, "lookup_order", order_id=lookup.metadata["order_id"]))
    assert result["status"] == lookup.metadata["status"]
    assert world.grade(f"It is {result['status']}.") == 1.0
    assert world.grade("No idea.") == 0.0


async def test_worlds_are_private_to_their_episode() -> None:
    """Two worlds of the same task never share state."""
    env = SupportDeskEnv(num_tasks=1)
    task = env.tasks()[0]
    a, b = env.start(task), env.start(task)
    await _run(a, "refund", order_id=task.metadata["order_id"], amount=1)
    assert a.refunds
    assert not b.refunds


@pytest.mark.parametrize("index", range(5))
def test_worlds_rebuild_from_the_prompt_alone(index: int) -> None:
    """A task from a file with no metadata gets the same kind and parameters from its prompt."""
    env = SupportDeskEnv(num_tasks=5)
    task = env.tasks()[index]
    bare = env.start(Task(task.id, task.prompt))
    full = env.start(task)
    assert bare.kind == full.kind
    for key, value in bare.params.items():
        assert task.metadata[key] == value
