"""Text-action worlds: the assistant's text is the action (Gymnasium-style tasks).

Tests: tests/envs/test_textaction.py, tests/envs/test_reasoning_gym.py.

Most RL task sources outside tool calling (reasoning-gym, TextArena, skyrl-gym, GEM) are
written as ``observation, reward, done = env.step(text)``: the model answers in text, the
environment reads the answer as a move and replies. A world opts into that loop mode by
subclassing `TextActionWorld` and implementing `step`; nothing in the config changes, since
a task written this way cannot be played any other way.

What the loop does with such a world (`collector.episode.loop`, step 6 of the check order):
a turn without tool calls is an action, not the final answer. Its text goes to
`TextActionWorld.act` (which calls `step`); when the result says `done` the episode ends as
`done`, else the observation is the next user message and the model takes another turn.
`loop.max_steps` bounds the model's turns as in any episode (`max_steps`). The check order
is unchanged, so a turn cut by the output-token cap ends as `length` (or is retried under
`loop.retry_cut_answers`) and a turn holding an unreadable tool call counts as malformed:
neither is ever sent to `step`, because a half-written move or answer is not an action. A
world may offer tools as well; a turn with tool calls runs them as usual.

The reward is `grade(final_text)`, as for every world; `final_text` is the last action.
The default `grade` is the sum of the rewards `step` returned (a Gymnasium return); a world
with an exact scorer (reasoning-gym's) overrides it. `step` raising, or returning anything
but a `StepResult` with a finite reward, ends the episode as `error`: a broken environment
is never a zero reward that looks like the model's failure.
"""

from __future__ import annotations

import inspect
import math
from abc import abstractmethod
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass

from collector.envs.base import EpisodeWorld, Tool

__all__ = ["StepResult", "TextActionWorld"]


@dataclass(slots=True, frozen=True)
class StepResult:
    """What the environment answers to one text action."""

    observation: str
    """The next user message (unused once `done`)."""
    reward: float = 0.0
    """This step's reward; the default `grade` sums them."""
    done: bool = False
    """The task is over: the episode ends as `done`."""


class TextActionWorld(EpisodeWorld):
    """A world whose actions are the assistant's text (see the module docstring)."""

    @property
    def step_rewards(self) -> list[float]:
        """The reward of every step taken so far, in order (kept without an ``__init__``, so a
        subclass that defines its own need not call this one's)."""
        found: list[float] | None = self.__dict__.get("_step_rewards")
        if found is None:
            found = self.__dict__["_step_rewards"] = []
        return found

    @property
    def tools(self) -> Sequence[Tool]:
        return ()

    @abstractmethod
    def step(self, text: str) -> StepResult | Awaitable[StepResult]:
        """Take the assistant's text as one action; may be a coroutine."""

    async def act(self, text: str) -> StepResult:
        """`step`, checked: the loop's one way in. Raises `TypeError` or `ValueError` for a
        result the loop cannot use (the episode then ends as `error`)."""
        result = self.step(text)
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, StepResult):
            raise TypeError(f"step returned {type(result).__name__}, not a StepResult")
        if not isinstance(result.observation, str):
            raise TypeError(f"step's observation is {type(result.observation).__name__}, not a str")
        reward = float(result.reward)
        if not math.isfinite(reward):
            raise ValueError(f"step returned a non-finite reward ({reward!r})")
        self.step_rewards.append(reward)
        return result

    def grade(self, final_text: str | None) -> float:
        """The sum of the steps' rewards (override it to score the final state instead)."""
        return sum(self.step_rewards)
