"""The loop's reply limits: too many calls in a turn, or arguments too long, end the episode
as a non-trainable `error` and nothing of that turn runs."""

from __future__ import annotations

from collector.config import LoopConfig, RunConfig, SweepConfig, config_fingerprint, data_identity
from collector.episode.loop import EpisodeSpec, run_episode
from collector.errors import ProtocolViolation
from collector.providers.scripted import ScriptedProvider, call, calls, text
from collector.stop import StopReason
from collector.turn import ArgStatus, ToolCall
from tests.episode.helpers import ToyEnv, run
from tests.faults.secret_env import SecretEnv


def _refunds(n: int) -> list[ToolCall]:
    return [call("refund", {"order_id": f"A-{i}", "amount": 1}, id=f"c{i}") for i in range(n)]


async def test_ten_thousand_calls_in_one_turn_run_none_and_end_as_error() -> None:
    """10,000 calls in one turn (default limit 128): none runs, the episode is an untrainable error."""
    env = ToyEnv()
    ep, _, _ = await run([calls(*_refunds(10_000)), text("done")], env=env)
    assert ep.stop_reason is StopReason.ERROR
    assert not ep.trainable
    assert ep.reward == 0.0
    assert ep.error is not None
    assert ep.error.type == ProtocolViolation.__name__
    assert "loop.max_tool_calls_per_turn = 128" in ep.error.message
    assert env.log == []
    assert ep.executed_tool_calls == []
    assert ep.turns == []  # the offending turn is not stored either


async def test_calls_up_to_the_limit_run_and_one_more_runs_none() -> None:
    """At max_tool_calls_per_turn every call runs; one call more and none of the turn runs."""
    at_limit = ToyEnv()
    ep, _, _ = await run([calls(*_refunds(3)), text("done")], env=at_limit, max_tool_calls_per_turn=3)
    assert ep.stop_reason is StopReason.DONE
    assert len(at_limit.log) == 3

    over = ToyEnv()
    ep, _, _ = await run([calls(*_refunds(4)), text("done")], env=over, max_tool_calls_per_turn=3)
    assert ep.stop_reason is StopReason.ERROR
    assert over.log == []


async def test_an_oversized_argument_holds_every_call_of_its_turn() -> None:
    """One call's arguments over max_argument_bytes (as text or as an object): no call of the turn runs."""
    big = "x" * 2000
    as_text = call("refund", {"order_id": big, "amount": 1}, id="big")
    as_object = ToolCall("big", "refund", {"order_id": big, "amount": 1}, ArgStatus.OK, raw_object={
        "order_id": big, "amount": 1})
    for oversized in (as_text, as_object):
        env = ToyEnv()
        small = call("refund", {"order_id": "A-1", "amount": 1}, id="small")
        ep, _, _ = await run([calls(small, oversized), text("done")], env=env, max_argument_bytes=1000)
        assert ep.stop_reason is StopReason.ERROR
        assert ep.error is not None
        assert "loop.max_argument_bytes = 1000" in ep.error.message
        assert env.log == []
        assert ep.executed_tool_calls == []


def test_the_limits_at_their_defaults_leave_the_fingerprint_alone() -> None:
    """Run directories written before the limits existed still resume: defaults are not in the identity."""
    cfg = RunConfig(sweep=SweepConfig(models=["m"], budgets=[64]))
    assert "max_tool_calls_per_turn" not in data_identity(cfg)["loop"]
    assert "max_argument_bytes" not in data_identity(cfg)["loop"]
    changed = cfg.model_copy(update={"loop": LoopConfig(max_tool_calls_per_turn=4)})
    assert config_fingerprint(changed) != config_fingerprint(cfg)


async def test_loop_max_tool_result_bytes_bounds_what_a_tool_may_return() -> None:
    """`loop.max_tool_result_bytes` reaches the tool runner: a result over it is neither
    stored nor sent back, the call's result says so; one at the bound passes."""
    env = SecretEnv()
    results = []
    for note in ("x" * 14, "x" * 15):  # "noted: " + note: 21 and 22 bytes
        script = [calls(call("echo_note", {"note": note})), text("done")]
        spec = EpisodeSpec("run", "model", "scripted", 64, env.tasks()[1], env_name=env.name)
        episode = await run_episode(spec, ScriptedProvider(script), env,
                                    LoopConfig.model_validate({"max_tool_result_bytes": 21}))
        (result,) = [m for m in episode.messages if m.role == "tool"]
        results.append((result.text, result.is_error))
    assert results[0] == ("noted: " + "x" * 14, False)
    assert results[1][1] is True
    assert "over loop.max_tool_result_bytes = 21" in results[1][0]
    assert "x" * 15 not in results[1][0]
