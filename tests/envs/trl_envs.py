"""TRL environment classes written the way TRL's docs write them (docs/source/openenv.md):
no constructor arguments, `reset(self, **kwargs) -> str | None`, typed public methods with
Google-style docstrings as tools, state on the instance for reward functions to read.

The remote clients of the docs (an Echo server, TextArena's Wordle) are replaced by local
state, so the tests need no network; the shape of each class is the docs'.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Literal

EXECUTIONS: list[tuple[int, str, dict[str, Any]]] = []
"""Every tool execution of `LoggedShopEnv`: (instance id, tool, arguments)."""
_LOCK = threading.Lock()
RESETS: list[dict[str, Any]] = []
"""The keyword arguments of every `WordleEnv.reset`."""
REWARD_CALLS: list[dict[str, Any]] = []
"""The arguments of every `wordle_reward` call (instances by id)."""


class EchoToolEnv:
    """The docs' quick-start class, with the Echo server's reply computed locally."""

    def __init__(self):
        self.reward = 0.0

    def reset(self, **kwargs) -> str | None:
        self.reward = 0.0
        return None

    def echo(self, message: str) -> str:
        """
        Echo the message back from the environment.

        Args:
            message: The message to echo

        Returns:
            The echoed message.
        """
        self.reward = float(len(message)) / 10
        return message


def reward_func(environments, **kwargs) -> list[float]:
    return [env.reward for env in environments]


class WordleEnv:
    """The docs' Wordle class: `reset()` returns the first observation, `guess()` raises once the
    game is over; the secret word comes from the dataset row's `answer` column."""

    def __init__(self):
        self.reward = 0.0
        self.done = False
        self.guesses: list[str] = []

    def reset(self, **kwargs) -> str | None:
        RESETS.append(dict(kwargs))
        self.answer = kwargs["answer"]
        self.reward = 0.0
        self.done = False
        return "\nGuess the 5-letter word, formatted as '[abcde]'."

    def guess(self, guess: str) -> str:
        """
        Make a guess in the Wordle environment.

        Args:
            guess: The guessed word, formatted as '[abcde]'

        Returns:
            The feedback message from the environment.
        """
        if self.done:
            raise ValueError("Game over.")
        self.guesses.append(guess)
        word = guess.strip("[]")
        self.done = word == self.answer or len(self.guesses) >= 2
        self.reward = 1.0 if word == self.answer else 0.0
        return "GGGGG" if word == self.answer else "XXXXX"


def wordle_reward(environments, answer, **kwargs) -> list[float]:
    """TRL passes every column but prompt as a list, one value per rollout."""
    REWARD_CALLS.append({"environments": [id(e) for e in environments], "answer": answer, **kwargs})
    return [env.reward if env.answer == a else -1.0 for env, a in zip(environments, answer, strict=True)]


def bonus_reward(environments, **kwargs) -> list[float | None]:
    """None: this function does not score the rollout (TRL turns it into NaN and skips it)."""
    return [None for _ in environments]


class TypedToolsEnv:
    """Every argument shape TRL's schema builder knows, and members TRL does not offer."""

    def reset(self, **kwargs) -> str | None:
        return None

    def book(
        self,
        city: str,
        nights: int,
        kind: Literal["hotel", "hostel"],
        guests: list[str],
        budget: float | None = None,
        breakfast: bool = False,
    ) -> str:
        """Book a stay.

        Longer text is part of the description.

        Args:
            city: Where to stay
                (the city's English name)
            nights: How many nights
            kind: Which kind of place
            guests: Who is coming
            budget: Most to spend, if any
            breakfast: Whether breakfast is included

        Returns:
            A confirmation.
        """
        return f"{kind} in {city} for {nights} nights"

    def rate(self, stars: int) -> dict[str, int]:
        """Rate the stay.

        Args:
            stars: How many stars (choices: [1, 2, 3])
        """
        return {"stars": stars}

    @classmethod
    def cancel(cls, reason: str) -> str:
        """Cancel the booking.

        Args:
            reason: Why
        """
        return "cancelled"

    @staticmethod
    def helper(x: int) -> int:  # a static method is a plain function on the instance: not a tool
        return x

    def get_reward(self) -> float:
        return 0.5

    def _private(self, x: int) -> int:
        return x


class LoggedShopEnv:
    """A shop whose every tool execution is logged (`EXECUTIONS`): the guarantee's witness."""

    def __init__(self):
        self.total = 0
        self.target = 0

    def reset(self, **kwargs) -> str | None:
        self.target = int(kwargs["target"])
        self.total = 0
        return None

    def add_item(self, sku: str, quantity: int) -> str:
        """Add items to the cart.

        Args:
            sku: The item's code, as in the order
            quantity: How many
        """
        with _LOCK:
            EXECUTIONS.append((id(self), "add_item", {"sku": sku, "quantity": quantity}))
        self.total += quantity
        return f"cart holds {self.total}"

    def add_note(self, text: str) -> str:
        """Attach a note to the order.

        Args:
            text: The note
        """
        with _LOCK:
            EXECUTIONS.append((id(self), "add_note", {"text": text}))
        return "noted"


def shop_reward(environments, **kwargs) -> list[float]:
    return [1.0 if env.total == env.target else 0.0 for env in environments]


class NoToolsEnv:
    def reset(self, **kwargs) -> str | None:
        return None


class NoResetEnv:
    def look(self, where: str) -> str:
        """Look around.

        Args:
            where: Where to look
        """
        return where


class UndocumentedEnv:
    def reset(self, **kwargs) -> str | None:
        return None

    def look(self, where: str) -> str:
        return where


class UndescribedArgEnv:
    def reset(self, **kwargs) -> str | None:
        return None

    def look(self, where: str, how: str) -> str:
        """Look around.

        Args:
            where: Where to look
        """
        return where


def raising_reward(environments, **kwargs) -> list[float]:
    raise RuntimeError("judge unreachable")


def two_rewards(environments, **kwargs) -> list[float]:
    return [1.0, 1.0]


def nan_reward(environments, **kwargs) -> list[float]:
    return [math.nan]


def not_a_list_reward(environments, **kwargs) -> float:
    return 1.0


NOT_CALLABLE = 3


class ResetFailsEnv(EchoToolEnv):
    """A client whose server is down: reset() raises for every episode."""

    def reset(self, **kwargs) -> str | None:
        raise ConnectionError("env server refused the connection")
