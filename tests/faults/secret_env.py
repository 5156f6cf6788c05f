"""A small environment whose tools take credentials, for the secrets test.

Loaded by Ray workers as `tests.faults.secret_env:SecretEnv` (the repository root on
`env.python_path`). Task `login-0` is the one the fake provider answers with a 400 that
echoes the credentials it received; the others get a `login` call carrying a password and a
token, and a `configure` call whose settings hold a value under each widened secret-key name
(`WIDENED`). The grade is 1.0 only when both tools received every real value: redaction is
for the record, never for the tool. Tasks 4-8 plant what only some scrub of the record sees,
for the token-id rule (tests/faults/test_secrets.py says which): `echo_note` returns what
it is given (a tool result that repeats a credential the model passed), `read_settings`
returns the environment's own secret under a secret key (`ENV_SECRET`) and, in plain text
under no secret key, the credential the environment declares (`ENV_CREDENTIAL`, from
`Environment.credentials`: only the worker's adding it to the run's credentials hides it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from collector.envs.base import Environment, EpisodeWorld, Task, Tool
from collector.envs.toolkit import tool

#: A planted value under each name the default secret-key list gained (and its word-part
#: variants); `author` and `keyboard` are the innocent names the rule must leave alone.
WIDENED: dict[str, Any] = {
    "passwd": "PLANTED-w-passwd", "pwd": "PLANTED-w-pwd", "private_key": "PLANTED-w-private-key",
    "access_key": "PLANTED-w-access-key", "credentials": {"user": "bob", "pin": "PLANTED-w-cred-pin"},
    "auth": "PLANTED-w-auth", "session_id": "PLANTED-w-session", "authToken": "PLANTED-w-auth-token",
    "x-api-key": "PLANTED-w-x-api-key", "db_password": "PLANTED-w-db-password",
    "passphrase": "PLANTED-w-passphrase", "jwt": "PLANTED-w-jwt",
    "author": "Ann Author", "keyboard": "qwerty",
}  # fmt: skip

#: The environment's own secret, in a tool result under a secret key.
ENV_SECRET = "PLANTED-env-db-password"

#: A credential the environment holds and declares (as an MCP server's `pass_env` key is),
#: returned in free text where no secret-key rule can see it.
ENV_CREDENTIAL = "PLANTED-env-declared-credential"

#: How many tasks there are (0: the echoed 400, 1-3: the logins, 4-8: the token-id cases).
TASKS = 9


class _World(EpisodeWorld):
    def __init__(self) -> None:
        self.logged_in = False
        self.configured = False
        self._tools = (
            tool(self.login, inline=True), tool(self.configure, inline=True),
            tool(self.echo_note, inline=True), tool(self.read_settings, inline=True),
        )

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    def login(self, username: str, password: str, api_token: str) -> str:
        """Log in to the account service."""
        self.logged_in = bool(username and password and api_token)
        return "logged in" if self.logged_in else "denied"

    def configure(self, settings: dict[str, Any]) -> str:
        """Store connection settings."""
        self.configured = all(settings.get(k) == v for k, v in WIDENED.items())
        return "configured" if self.configured else "incomplete"

    def echo_note(self, note: str) -> str:
        """Keep a note; returns it."""
        return f"noted: {note}"

    def read_settings(self) -> str:
        """The service's connection settings."""
        return json.dumps({"host": "db.internal", "db_password": ENV_SECRET,
                           "motd": f"connected with {ENV_CREDENTIAL}"})

    def grade(self, final_text: str | None) -> float:
        return 1.0 if self.logged_in and self.configured else 0.0


class SecretEnv(Environment):
    name = "secret_env"

    def tasks(self) -> Sequence[Task]:
        return [Task(f"login-{i}", f"Log in for task {i}, then say done.") for i in range(TASKS)]

    def start(self, task: Task) -> EpisodeWorld:
        return _World()

    def credentials(self) -> tuple[str, ...]:
        return (ENV_CREDENTIAL,)
