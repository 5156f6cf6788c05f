"""A number-guessing game as a typed-action OpenEnv environment, served with openenv's own
`create_app` (the shape of openenv's `openenv init` template).

    python -m openenv_guess.server 8000   # http://127.0.0.1:8000, sessions on /ws

The action model `GuessAction` has one field, `guess`; the collector's `openenv`
environment offers it to the model as one tool (`act`) whose parameters are that model's
JSON Schema. `reset(seed)` picks the secret (``seed % 10 + 1``); every wrong guess is
answered "higher" or "lower" with reward 0, the right one with reward 1 and `done`, which
ends the collector's episode as `done`. configs/openenv_demo.toml runs it on the simulator.
"""

from __future__ import annotations

import sys
from typing import Any

import uvicorn
from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field


class GuessAction(Action):
    """Guess the secret number."""

    guess: int = Field(..., ge=1, le=10, description="Your guess, from 1 to 10")


class GuessObservation(Observation):
    message: str = Field(default="", description="What the game says")


class GuessEnvironment(Environment):  # type: ignore[misc]
    """One game per session: the secret is drawn from the reset's seed."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.secret = 1
        self._state = State(episode_id="", step_count=0)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> GuessObservation:
        self.secret = (seed or 0) % 10 + 1
        self._state = State(episode_id=episode_id or "", step_count=0)
        return GuessObservation(message="I picked a number from 1 to 10.", reward=None, done=False)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:  # type: ignore[override]
        self._state.step_count += 1
        if action.guess == self.secret:
            return GuessObservation(message="right!", reward=1.0, done=True)
        hint = "higher" if action.guess < self.secret else "lower"
        return GuessObservation(message=hint, reward=0.0, done=False)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=64)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
