"""A few-shot weather environment for the real llama-server sweep (`scripts/real_llama_sweep`).

Gemma 3 270M is a base model: plain chat is junk. Each task's prompt therefore carries two
earlier weather questions with their `get_weather` calls, results and answers, then the real
question; the model calls the tool, reads the result and answers (and, being a base model,
often rambles on after the answer: what `collector stats --per turn` makes visible).
Not used by the test suite.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from collector.envs.base import Environment, EpisodeWorld, Task, Tool
from collector.tools import tool
from collector.turn import ArgStatus, AssistantMessage, Message, ToolCall, ToolResultMessage, UserMessage

CITIES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Perth", "Dakar")
_SHOTS = (("Berlin", "celsius", 14), ("Boston", "fahrenheit", 61))


def _shot(n: int, city: str, unit: str, degrees: int) -> list[Message]:
    args = {"city": city, "unit": unit}
    call = ToolCall(f"call_shot{n}", "get_weather", args, ArgStatus.OK, raw_arguments=json.dumps(args))
    return [
        UserMessage(f"What is the weather in {city}?"),
        AssistantMessage("", [call]),
        ToolResultMessage(call.id, "get_weather", json.dumps({"city": city, "degrees": degrees,
                                                               "unit": unit})),
        AssistantMessage(f"It is {degrees} degrees {unit} in {city}."),
    ]


class WeatherWorld(EpisodeWorld):
    def __init__(self, city: str) -> None:
        self.city = city
        self._tools = (tool(self.get_weather, inline=True),)

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    def get_weather(self, city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
        """The current temperature in a city."""
        return json.dumps({"city": city, "degrees": 21, "unit": unit})

    def grade(self, final_text: str | None) -> float:
        return 1.0 if final_text and self.city.lower() in final_text.lower() else 0.0


class WeatherEnv(Environment):
    name = "weather_fewshot"

    def tasks(self) -> Sequence[Task]:
        shots = [m for n, (c, u, d) in enumerate(_SHOTS) for m in _shot(n, c, u, d)]
        return [Task(f"weather-{c.lower()}", [*shots, UserMessage(f"What is the weather in {c}?")],
                     {"city": c}) for c in CITIES]

    def start(self, task: Task) -> WeatherWorld:
        return WeatherWorld(str(task.metadata["city"]))


environment = WeatherEnv()
