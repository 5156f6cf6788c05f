"""A small environment whose one tool takes credentials, for the secrets test.

Loaded by Ray workers as `tests.faults.secret_env:SecretEnv` (the repository root on
`env.python_path`). Task `login-0` is the one the fake provider answers with a 401 that
echoes the API key; the others get a `login` call carrying a password and a token.
"""

from __future__ import annotations

from collections.abc import Sequence

from collector.envs.base import Environment, EpisodeWorld, Task, Tool
from collector.envs.tools import tool


class _World(EpisodeWorld):
    def __init__(self) -> None:
        self.logged_in = False
        self._tools = (tool(self.login, inline=True),)

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    def login(self, username: str, password: str, api_token: str) -> str:
        """Log in to the account service."""
        self.logged_in = bool(username and password and api_token)
        return "logged in" if self.logged_in else "denied"

    def grade(self, final_text: str | None) -> float:
        return 1.0 if self.logged_in else 0.0


class SecretEnv(Environment):
    name = "secret_env"

    def tasks(self) -> Sequence[Task]:
        return [Task(f"login-{i}", f"Log in for task {i}, then say done.") for i in range(4)]

    def start(self, task: Task) -> EpisodeWorld:
        return _World()
