"""The episode loop against the scripted provider: check order, settlement, limits, rewards."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from collector.config import LoopConfig
from collector.envs.base import Environment, EpisodeWorld, Task, Tool
from collector.episode import notices
from collector.episode.loop import EpisodeSpec, run_episode
from collector.errors import ProviderUnavailable
from collector.providers.scripted import ScriptedProvider, call, calls, cut, leaked, text
from collector.record.episode import episode_id
from collector.stop import StopReason
from collector.turn import LengthSignal, Turn, TurnRequest
from tests.episode.helpers import ToyEnv, run

REFUND_CUT = '{"order_id": "A-1001", "amount": 10'


def _log(env: Environment) -> list[tuple[str, dict[str, object]]]:
    assert isinstance(env, ToyEnv)
    return env.log


async def test_cut_refund_never_runs_and_ends_as_length() -> None:
    """A refund cut at "amount": 10 is never executed; the episode ends as length, reward 0."""
    ep, provider, env = await run([cut(call("refund", REFUND_CUT, id="c1"), output_tokens=64)])
    assert ep.stop_reason is StopReason.LENGTH
    assert _log(env) == []
    assert ep.executed_tool_calls == []
    assert ep.reward == 0.0
    assert ep.graded_reward is None
    assert ep.trainable
    assert ep.turns[0].discarded
    assert ep.wasted_output_tokens == 64
    result = ep.messages[-1]
    assert result.call_id == "c1"
    assert result.is_error
    assert result.text == notices.CUT
    assert provider.remaining == 0


async def test_cut_turn_with_complete_looking_object_never_runs() -> None:
    """A cut turn whose arguments parse (Anthropic input, Gemini args) is still not executed."""
    turn = cut(
        call("refund", {"order_id": "A-1001", "amount": 10}, id="c1"),
        call("close_tickets", {}, id="c2"),
        signals=(LengthSignal.CAP_REACHED,),
        raw_finish_reason="tool_calls",
    )
    ep, _, env = await run([turn])
    assert ep.stop_reason is StopReason.LENGTH
    assert _log(env) == []
    assert [m.call_id for m in ep.messages if m.role == "tool"] == ["c1", "c2"]
    stored = ep.messages[1].tool_calls[0]
    assert stored.arguments_json == '{"order_id":"A-1001","amount":10}'


async def test_length_not_in_stop_on_asks_for_shorter_call_and_goes_on() -> None:
    """Without length in stop_on a cut call is refused with a retry hint and the loop goes on."""
    script = [
        cut(call("refund", REFUND_CUT, id="c1")),
        calls(call("refund", {"order_id": "A-1001", "amount": 1000}, id="c2")),
        text("done"),
    ]
    ep, provider, env = await run(script, stop_on=[])
    assert ep.stop_reason is StopReason.DONE
    assert _log(env) == [("refund", {"order_id": "A-1001", "amount": 1000})]
    assert ep.reward == 1.0
    retry = next(m for m in ep.messages if m.call_id == "c1")
    assert retry.text == notices.CUT_RETRY
    assert retry.is_error
    # The second request carried the refused call and its error result (replayable history).
    second = provider.requests[1].messages
    assert [type(m).__name__ for m in second] == ["UserMessage", "AssistantMessage", "ToolResultMessage"]
    assert ep.is_truncated


async def test_consecutive_cut_turns_end_as_length() -> None:
    """After max_consecutive_faults cut turns in a row the episode ends as length."""
    script = [cut(call("refund", REFUND_CUT)), cut(call("refund", REFUND_CUT)), text("done")]
    ep, provider, env = await run(script, stop_on=[], max_consecutive_faults=2)
    assert ep.stop_reason is StopReason.LENGTH
    assert provider.remaining == 1
    assert _log(env) == []


async def test_cut_final_answer_ends_the_episode_whatever_stop_on_says() -> None:
    """A cut turn with no tool call ends the episode as length even with stop_on = []: no injected turn."""
    ep, provider, _ = await run([cut(text="The answer is"), text("done")], stop_on=[])
    assert ep.stop_reason is StopReason.LENGTH
    assert provider.remaining == 1  # the model was not called again
    assert [m.role for m in ep.messages] == ["user", "assistant"]
    assert ep.turns[0].discarded
    assert ep.reward == 0.0


async def test_cut_call_without_length_in_stop_on_still_goes_on() -> None:
    """A cut turn *with* a call keeps today's behaviour under stop_on = []: settled with an error, loop on."""
    script = [cut(call("refund", REFUND_CUT, id="c1")), text("done")]
    ep, _, _ = await run(script, stop_on=[])
    assert ep.stop_reason is StopReason.DONE


async def test_cut_text_turn_is_asked_again_only_when_opted_in() -> None:
    """With loop.retry_cut_answers a cut final answer is followed by a user notice and another call."""
    ep, provider, _ = await run([cut(text="The answer is"), text("done")], stop_on=[], retry_cut_answers=True)
    assert ep.stop_reason is StopReason.DONE
    assert provider.requests[1].messages[-1].text == notices.CUT_TEXT_NOTICE  # type: ignore[union-attr]


async def test_malformed_in_stop_on_ends_and_nothing_runs() -> None:
    """With malformed_tool_call in stop_on the turn's valid siblings do not run either."""
    turn = calls(
        call("close_tickets", '{"customer_id": "C-77", "older_than_d', id="bad"),
        call("refund", {"order_id": "A-1", "amount": 5}, id="good"),
    )
    ep, _, env = await run([turn])
    assert ep.stop_reason is StopReason.MALFORMED_TOOL_CALL
    assert _log(env) == []
    assert ep.turns[0].discarded
    assert ep.turns[0].malformed_calls == 1
    results = {m.call_id: m.text for m in ep.messages if m.role == "tool"}
    assert results == {"bad": notices.MALFORMED_END, "good": notices.SIBLING_END}
    assert ep.reward == 0.0


async def test_malformed_not_in_stop_on_errors_the_call_and_runs_siblings() -> None:
    """A malformed call gets an error naming the problem, not the fragment; siblings run."""
    fragment = '{"customer_id": "C-77", "older_than_d'
    turn = calls(call("close_tickets", fragment, id="bad"), call("refund", {"order_id": "A-1", "amount": 5}))
    ep, _, env = await run([turn, text("done")], stop_on=["length"])
    assert ep.stop_reason is StopReason.DONE
    assert _log(env) == [
        ("refund", {"order_id": "A-1", "amount": 5})
    ]  # close_tickets never ran with defaults
    bad = next(m for m in ep.messages if m.call_id == "bad")
    assert bad.is_error
    assert "not a valid JSON object" in bad.text
    assert "C-77" not in bad.text
    assert f"{len(fragment)} characters" in bad.text


async def test_consecutive_malformed_turns_are_capped() -> None:
    """Malformed turns in a row end the episode as malformed_tool_call after the cap."""
    script = [calls(call("refund", "{")), calls(call("refund", "{")), text("done")]
    ep, _, _ = await run(script, stop_on=["length"], max_consecutive_faults=2)
    assert ep.stop_reason is StopReason.MALFORMED_TOOL_CALL
    assert ep.turns[0].discarded is False
    assert ep.turns[1].discarded is True


async def test_unparsed_template_call_is_malformed_not_an_answer() -> None:
    """A turn whose call stayed in the text as a template block is never taken as a final answer."""
    ep, _, _ = await run([leaked('<tool_call>{"name": "refund"')])
    assert ep.stop_reason is StopReason.MALFORMED_TOOL_CALL
    gemini = text("")
    gemini.raw_finish_reason = "MALFORMED_FUNCTION_CALL"
    ep, _, _ = await run([gemini])
    assert ep.stop_reason is StopReason.MALFORMED_TOOL_CALL
    assert ep.turns[0].unparsed_tool_call
    ep, provider, _ = await run([leaked("<tool_call>{}"), text("done")], stop_on=[])
    assert ep.stop_reason is StopReason.DONE
    assert provider.requests[1].messages[-1].text == notices.UNPARSED_NOTICE  # type: ignore[union-attr]


async def test_malformed_gate_holds_every_sibling() -> None:
    """A malformed call to a gate tool defers its siblings with a nothing-was-approved error."""
    turn = calls(
        call("approve", '{"order_id": "A-1', id="gate"),
        call("refund", {"order_id": "A-1", "amount": 900}, id="sib"),
    )
    ep, _, env = await run([turn, text("done")], stop_on=[])
    assert _log(env) == []
    sib = next(m for m in ep.messages if m.call_id == "sib")
    assert sib.is_error
    assert "nothing was approved" in sib.text


async def test_gate_runs_first_and_a_failing_gate_holds_siblings() -> None:
    """Gate calls run before their siblings; a gate that errors holds the rest of the turn."""
    turn = calls(call("refund", {"order_id": "A-1", "amount": 900}), call("approve", {"order_id": "A-1"}))
    ep, _, env = await run([turn, text("done")])
    assert [name for name, _ in _log(env)] == ["approve", "refund"]
    ep, _, env = await run([turn, text("done")], env=ToyEnv(approve_ok=False))
    assert [name for name, _ in _log(env)] == ["approve"]
    assert sum(m.is_error for m in ep.messages) == 2


async def test_gate_with_invalid_arguments_holds_siblings() -> None:
    """A gate call failing schema validation (nothing ran) also holds its siblings."""
    turn = calls(call("approve", {"order": "A-1"}), call("refund", {"order_id": "A-1", "amount": 900}))
    ep, _, env = await run([turn, text("done")])
    assert _log(env) == []
    assert ep.executed_tool_calls == []


async def test_unknown_tool_and_tool_failures_are_results() -> None:
    """Unknown tools, invalid arguments, exceptions and timeouts become error results."""
    turn = calls(
        call("nope", {}, id="a"),
        call("refund", {"order_id": "A-1", "amount": "1000"}, id="b"),
        call("boom", {}, id="c"),
        call("slow", {}, id="d"),
    )
    ep, _, env = await run([turn, text("done")])
    assert ep.stop_reason is StopReason.DONE
    results = {m.call_id: m.text for m in ep.messages if m.role == "tool"}
    assert results["a"].startswith("error: there is no tool named")
    assert results["b"].startswith("error: invalid arguments for refund: amount")
    assert results["c"] == "error: boom failed: RuntimeError: kaput"
    assert results["d"] == "error: slow timed out after 0.05 s"
    assert ep.tool_errors == 4
    assert [e.call_id for e in ep.executed_tool_calls] == ["c", "d"]  # "b" was refused before running
    assert _log(env) == [("slow", {})]


async def test_max_steps() -> None:
    """A model that keeps calling tools ends at max_steps, graded by default."""
    script = [calls(call("refund", {"order_id": "A-1", "amount": 1})) for _ in range(3)]
    ep, _, _ = await run(script, max_steps=3)
    assert ep.stop_reason is StopReason.MAX_STEPS
    assert ep.num_turns == 3
    assert ep.reward == 0.5
    assert ep.graded_reward == 0.5
    ep, _, _ = await run(script, max_steps=3, reward={"grade_max_steps": False})
    assert ep.reward == 0.0
    assert ep.graded_reward is None


async def test_reward_policies_for_cut_episodes() -> None:
    """Cut episodes: zero by default; graded value kept with grade_cut_episodes; clamp policy."""
    script = [cut(call("refund", REFUND_CUT))]
    ep, _, _ = await run(script, reward={"grade_cut_episodes": True})
    assert (ep.reward, ep.graded_reward) == (0.0, 0.5)
    ep, _, _ = await run(script, reward={"policy": "grade_then_clamp"})
    assert (ep.reward, ep.graded_reward) == (0.0, None)


async def test_episode_output_budget_shrinks_the_cap_and_ends_as_length() -> None:
    """The episode budget caps each turn at what remains; nothing left ends the episode as length."""
    steps = [calls(call("refund", {"order_id": "A-1", "amount": 1}), output_tokens=40) for _ in range(3)]
    ep, provider, _ = await run(steps, budget=64, episode_output_budget=100)
    assert [r.max_output_tokens for r in provider.requests] == [64, 60, 20]
    assert ep.stop_reason is StopReason.LENGTH
    assert [t.max_output_tokens for t in ep.turns] == [64, 60, 20]


class _Hang:
    def __init__(self) -> None:
        self.cancelled = False

    async def __call__(self, request: TurnRequest) -> Turn:
        raise NotImplementedError

    async def complete(self, request: TurnRequest) -> Turn:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError("unreachable")


async def test_episode_timeout_cancels_the_model_call() -> None:
    """The wall-clock limit cancels the in-flight model call; the episode is an untrainable timeout."""
    provider = _Hang()
    provider.kind = "hang"  # type: ignore[attr-defined]
    env = ToyEnv()
    spec = EpisodeSpec("run", "m", "hang", 64, env.tasks()[0])
    ep = await run_episode(spec, provider, env, LoopConfig(episode_timeout_s=0.05))  # type: ignore[arg-type]
    assert ep.stop_reason is StopReason.TIMEOUT
    assert provider.cancelled
    assert not ep.trainable  # a slow provider is not the model's doing
    assert ep.reward == 0.0


async def test_episode_timeout_settles_open_calls() -> None:
    """A timeout during a tool call settles every call of that turn, the later ones unrun."""
    turn = calls(call("slow", {}, id="s"), call("refund", {"order_id": "A", "amount": 1}, id="r"))
    env = ToyEnv()
    ep, _, _ = await run([turn], env=env, episode_timeout_s=0.02, tool_timeout_s=10)
    assert ep.stop_reason is StopReason.TIMEOUT
    results = {m.call_id: m.text for m in ep.messages if m.role == "tool"}
    assert results == {"s": notices.TIMED_OUT, "r": notices.TIMED_OUT}
    assert _log(env) == [("slow", {})]


async def test_provider_error_is_an_untrainable_error_episode() -> None:
    """A ProviderError after retries gives stop_reason error, trainable False, reward 0."""
    ep, _, _ = await run([])
    assert ep.stop_reason is StopReason.ERROR
    assert not ep.trainable
    assert ep.reward == 0.0
    assert ep.error is not None
    assert ep.error.type == ProviderUnavailable.__name__


async def test_unexpected_provider_exception_costs_one_episode() -> None:
    """An adapter bug (a non-ProviderError) ends that episode as error without its message."""

    def broken(request: TurnRequest) -> Turn:
        raise KeyError("sk-secret")

    ep, _, _ = await run([broken])
    assert ep.stop_reason is StopReason.ERROR
    assert ep.error is not None
    assert ep.error.type == "KeyError"
    assert "sk-secret" not in ep.error.message


class _Crashing(Environment):
    name = "crashing"

    def __init__(self, where: str) -> None:
        self.where = where

    def tasks(self) -> Sequence[Task]:
        return [Task("t", "hi")]

    def start(self, task: Task) -> EpisodeWorld:
        if self.where == "start":
            raise RuntimeError("db down password=hunter2")
        where = self.where

        class World(EpisodeWorld):
            @property
            def tools(self) -> Sequence[Tool]:
                return ()

            def grade(self, final_text: str | None) -> float:
                if where == "nan":
                    return float("nan")
                raise ValueError("grader broke")

        return World()


@pytest.mark.parametrize("where", ["start", "grade", "nan"])
async def test_environment_crash_is_an_error_episode(where: str) -> None:
    """A crash in env.start or the grader (or a NaN grade) ends the episode as error, secret-free."""
    ep, _, _ = await run([text("done")], env=_Crashing(where))
    assert ep.stop_reason is StopReason.ERROR
    assert not ep.trainable
    assert ep.error is not None
    assert ep.error.type == "EnvironmentFailure"
    assert "hunter2" not in ep.error.message


async def test_cancellation_propagates() -> None:
    """Cancelling the episode's task raises CancelledError to the caller (never swallowed)."""
    provider = _Hang()
    provider.kind = "hang"  # type: ignore[attr-defined]
    env = ToyEnv()
    spec = EpisodeSpec("run", "m", "hang", 64, env.tasks()[0])
    task = asyncio.ensure_future(run_episode(spec, provider, env, LoopConfig()))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_spec_ids_seed_and_record_fields() -> None:
    """EpisodeSpec computes the deterministic episode id; the episode seed reaches the request."""
    ep, provider, _ = await run([text("done")])
    assert ep.episode_id == episode_id("run", "t1", 0, "model", 64)
    assert provider.requests[0].params.seed == 7
    assert provider.requests[0].max_output_tokens == 64
    assert {t.name for t in provider.requests[0].tools} == {
        "refund",
        "close_tickets",
        "approve",
        "slow",
        "boom",
    }
    assert (ep.env, ep.provider, ep.task_id, ep.budget, ep.reward) == ("toy", "scripted", "t1", 64, 1.0)


async def test_scripted_provider_helpers() -> None:
    """The scripted helpers mark cut turns and parse argument text strictly."""
    provider = ScriptedProvider([cut(call("f", "{"))])
    turn = await provider.complete(TurnRequest("m", [], [], 33))
    assert turn.is_length
    assert turn.max_output_tokens == 33
    assert turn.tool_calls[0].arguments is None
    assert call("f", "[1]").arguments is None
    assert call("f", '{"a": 1}').arguments == {"a": 1}
