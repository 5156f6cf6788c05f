"""Text-action loop mode: a turn without tool calls is an action sent to the world's `step`."""

from __future__ import annotations

from collections.abc import Sequence

from collector.config import LoopConfig
from collector.envs.base import Environment, EpisodeContext, Task
from collector.envs.textaction import StepResult, TextActionWorld
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers.scripted import ScriptedProvider, Step, cut, leaked, text
from collector.record.episode import Episode
from collector.stop import StopReason


class GuessWorld(TextActionWorld):
    """Guess the number 7: every action is logged; a right guess is done with reward 1."""

    def __init__(self, log: list[str], broken: bool = False) -> None:
        self.log = log
        self.broken = broken

    def step(self, text: str) -> StepResult:
        self.log.append(text)
        if self.broken:
            raise RuntimeError("the board is gone")
        guess = text.strip()
        if guess == "7":
            return StepResult("correct", 1.0, done=True)
        return StepResult(f"{guess} is wrong; guess again", 0.0)


class GuessEnv(Environment):
    name = "guess"

    def __init__(self, broken: bool = False) -> None:
        self.log: list[str] = []
        self.broken = broken

    def tasks(self) -> Sequence[Task]:
        return [Task("g1", "Guess my number from 1 to 9. Answer with the number only.")]

    def start(self, task: Task, context: EpisodeContext) -> GuessWorld:
        return GuessWorld(self.log, self.broken)


async def _run(script: Sequence[Step], env: GuessEnv, **loop: object) -> Episode:
    spec = EpisodeSpec("run", "model", "scripted", 64, env.tasks()[0], seed=1, env_name=env.name)
    return await run_episode(spec, ScriptedProvider(script), env, LoopConfig.model_validate(loop))


async def test_text_turns_are_actions_and_observations_come_back_as_user_messages() -> None:
    """Each text turn is one `step`; a wrong guess's observation is the next user message and
    the right one ends the episode as `done` with the steps' summed reward."""
    env = GuessEnv()
    episode = await _run([text("3"), text("5"), text("7")], env)
    assert env.log == ["3", "5", "7"]
    assert episode.stop_reason is StopReason.DONE
    assert episode.reward == 1.0
    users = [m.text for m in episode.messages if m.role == "user"]
    assert users[1:] == ["3 is wrong; guess again", "5 is wrong; guess again"]


async def test_a_cut_text_turn_is_length_and_never_reaches_step() -> None:
    """A text turn cut by the output cap is not an action: the episode ends as `length` at
    reward 0 and `step` never sees the half-written text."""
    env = GuessEnv()
    episode = await _run([text("3"), cut(text="7 is surely the ans")], env)
    assert env.log == ["3"]
    assert episode.stop_reason is StopReason.LENGTH
    assert episode.reward == 0.0


async def test_a_cut_text_turn_retried_is_still_never_sent() -> None:
    """With `retry_cut_answers` the cut turn is answered with a notice, not sent to `step`;
    only the complete reply after it is an action."""
    env = GuessEnv()
    script = [cut(text="seven, becau"), text("7")]
    episode = await _run(script, env, retry_cut_answers=True, stop_on=[])
    assert env.log == ["7"]
    assert episode.stop_reason is StopReason.DONE


async def test_a_turn_with_an_unreadable_tool_call_is_malformed_not_an_action() -> None:
    """Text holding a chat-template tool call nobody could parse is `malformed_tool_call`,
    never a move sent to `step`."""
    env = GuessEnv()
    episode = await _run([leaked('<tool_call>{"name": "guess", "arguments": {"n": 7')], env)
    assert env.log == []
    assert episode.stop_reason is StopReason.MALFORMED_TOOL_CALL


async def test_max_steps_ends_a_text_action_episode() -> None:
    """Wrong guesses until `loop.max_steps` end the episode as `max_steps`."""
    env = GuessEnv()
    episode = await _run([text("1"), text("2")], env, max_steps=2)
    assert env.log == ["1", "2"]
    assert episode.stop_reason is StopReason.MAX_STEPS


async def test_a_step_that_raises_is_an_error_episode_naming_it() -> None:
    """An environment whose `step` raises ends the episode as `error` (not trainable) with a
    message naming the step and the cause, never as a zero reward."""
    env = GuessEnv(broken=True)
    episode = await _run([text("3")], env)
    assert episode.stop_reason is StopReason.ERROR
    assert not episode.trainable
    assert episode.error is not None
    assert episode.error.message == "step: RuntimeError: the board is gone"


class _NotAResult(GuessWorld):
    def step(self, text: str) -> StepResult:
        return {"observation": "?", "reward": float("nan")}  # type: ignore[return-value]


async def test_a_step_returning_the_wrong_type_is_an_error_episode() -> None:
    """A `step` that returns anything but a `StepResult` ends the episode as `error` saying so."""
    env = GuessEnv()
    env.start = lambda task, context: _NotAResult(env.log)  # type: ignore[method-assign]
    episode = await _run([text("3")], env)
    assert episode.stop_reason is StopReason.ERROR
    assert episode.error is not None
    assert episode.error.message == "step: TypeError: step returned dict, not a StepResult"
