"""TRL environment classes (`trl:package.module:Class`) run as collector environments, TRL's contract."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from collector.config import LoopConfig
from collector.envs.loading import load_environment
from collector.envs.trl import TRLEnvironment
from collector.episode.loop import EpisodeSpec, run_episode
from collector.errors import ConfigError
from collector.providers.scripted import ScriptedProvider, call, calls, text
from collector.stop import StopReason
from collector.turn import UserMessage
from tests.envs import trl_envs

M = "tests.envs.trl_envs"


def _rows(tmp_path: Path, rows: list[dict[str, Any]]) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _load(spec: str, tmp_path: Path, rows: list[dict[str, Any]], **options: Any) -> TRLEnvironment:
    env = load_environment(f"trl:{M}:{spec}", {"task_file": _rows(tmp_path, rows), **options})
    assert isinstance(env, TRLEnvironment)
    return env


def test_tool_schemas_follow_trl_rules() -> None:
    """Public methods in alphabetical order (class methods yes; static, private, reset and
    get_reward no), described by the docstring, typed by the hints, enums from Literal and choices."""
    from collector.envs.trlschema import method_tool_spec, tool_method_names

    instance = trl_envs.TypedToolsEnv()
    assert tool_method_names(instance) == ["book", "cancel", "rate"]
    description, book = method_tool_spec(instance.book)
    assert description == "Book a stay.\n\nLonger text is part of the description."
    assert book == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "Where to stay (the city's English name)"},
            "nights": {"type": "integer", "description": "How many nights"},
            "kind": {"type": "string", "enum": ["hotel", "hostel"], "description": "Which kind of place"},
            "guests": {"type": "array", "items": {"type": "string"}, "description": "Who is coming"},
            "budget": {"type": "number", "nullable": True, "description": "Most to spend, if any"},
            "breakfast": {"type": "boolean", "description": "Whether breakfast is included"},
        },
        "required": ["city", "nights", "kind", "guests"],
    }
    _, rate = method_tool_spec(instance.rate)
    assert rate["properties"]["stars"] == {
        "type": "integer",
        "enum": [1, 2, 3],
        "description": "How many stars",
    }


async def test_an_episode_runs_trl_s_contract(tmp_path: Path) -> None:
    """reset(**row) gets every column (prompt included) and its observation is appended to the
    user message; an exception from a tool is an error result and the episode goes on; the reward
    function gets the episode's instance and each column as a one-item list, once."""
    rows = [{"id": "w1", "prompt": [{"role": "user", "content": "Play Wordle."}], "answer": "crane"}]
    env = _load("WordleEnv", tmp_path, rows, reward=[f"{M}:wordle_reward", f"{M}:bonus_reward"])
    task = env.tasks()[0]
    script = [
        calls(call("guess", {"guess": "[slate]"})),
        calls(call("guess", {"guess": "[crane]"})),
        calls(call("guess", {"guess": "[crane]"})),
        text("done"),
    ]
    provider = ScriptedProvider(script)
    episode = await run_episode(EpisodeSpec("r", "m", "scripted", 256, task), provider, env, LoopConfig())
    assert episode.stop_reason is StopReason.DONE, episode.error
    assert episode.reward == 1.0
    assert trl_envs.RESETS[-1] == rows[0]
    called = [c for c in trl_envs.REWARD_CALLS if c["id"] == ["w1"]]
    assert len(called) == 1
    assert len(called[0]["environments"]) == 1
    assert called[0]["answer"] == ["crane"]
    assert called[0]["completions"] == [[{"role": "assistant", "content": "done"}]]
    assert called[0]["prompts"] == [
        [{"role": "user", "content": "Play Wordle.\nGuess the 5-letter word, formatted as '[abcde]'."}]
    ]
    assert "prompt" not in called[0]
    first = provider.requests[0].messages[0]
    assert isinstance(first, UserMessage)
    assert first.text == "Play Wordle.\nGuess the 5-letter word, formatted as '[abcde]'."
    results = [m for m in episode.messages if m.role == "tool"]
    assert [r.text for r in results[:2]] == ["XXXXX", "GGGGG"]
    assert results[2].is_error
    assert "ValueError: Game over." in results[2].text
    assert [t.name for t in provider.requests[0].tools] == ["guess"]


async def test_one_instance_per_episode(tmp_path: Path) -> None:
    """Concurrent episodes each reset and use their own instance: rewards never mix."""
    rows = [{"id": f"w{i}", "prompt": "Play.", "answer": w} for i, w in enumerate(["crane", "slate"])]
    env = _load("WordleEnv", tmp_path, rows, reward=[f"{M}:wordle_reward"])

    async def play(task_index: int, word: str) -> float | None:
        provider = ScriptedProvider([calls(call("guess", {"guess": f"[{word}]"})), text("ok")])
        spec = EpisodeSpec("r", "m", "scripted", 256, env.tasks()[task_index])
        return (await run_episode(spec, provider, env, LoopConfig())).reward

    assert await asyncio.gather(play(0, "crane"), play(1, "crane"), play(1, "slate")) == [1.0, 0.0, 1.0]


@pytest.mark.parametrize(
    ("cls", "options", "cause"),
    [
        ("NoToolsEnv", {"reward": [f"{M}:reward_func"]}, "offers no tools"),
        ("NoResetEnv", {"reward": [f"{M}:reward_func"]}, "has no callable reset()"),
        ("UndocumentedEnv", {"reward": [f"{M}:reward_func"]}, "method look() has no docstring"),
        ("UndescribedArgEnv", {"reward": [f"{M}:reward_func"]}, "argument 'how' has no description"),
        ("EchoToolEnv", {}, "has no reward"),
        (
            "EchoToolEnv",
            {"reward": [f"{M}:missing"]},
            "env.options.reward: 'tests.envs.trl_envs' has no attribute",
        ),
        ("EchoToolEnv", {"reward": [f"{M}:NOT_CALLABLE"]}, "is not callable"),
        ("EchoToolEnv", {"reward": ["nocolon"]}, "is not package.module:function"),
        ("EchoToolEnv", {"reward": [f"{M}:reward_func"], "seed": 1}, "unknown: seed"),
        ("EchoToolEnv", {"reward": [f"{M}:reward_func"], "dataset": "x"}, "not both"),
        ("reward_func", {"reward": [f"{M}:reward_func"]}, "is not a class"),
    ],
)
def test_bad_classes_and_rewards_are_one_line_before_the_run(
    tmp_path: Path, cls: str, options: dict[str, Any], cause: str
) -> None:
    """A class without tools or reset, a tool TRL could not describe, a reward that is missing or
    not callable, an unknown option: one ConfigError line naming the environment or field."""
    with pytest.raises(ConfigError) as info:
        _load(cls, tmp_path, [{"prompt": "p"}], **options)
    message = str(info.value)
    assert cause in message
    assert "\n" not in message
    assert "env." in message


def test_no_rows_is_refused(tmp_path: Path) -> None:
    """Without env.task_file or options.dataset there is nothing to run: refused before the run."""
    with pytest.raises(ConfigError, match="needs its rows"):
        load_environment(f"trl:{M}:EchoToolEnv", {"reward": [f"{M}:reward_func"]})


@pytest.mark.parametrize(
    ("reward", "cause"),
    [
        ("raising_reward", "raised RuntimeError: judge unreachable"),
        ("two_rewards", "returned 2 values for 1 episode"),
        ("nan_reward", "returned nan, not a finite number"),
        ("not_a_list_reward", "returned float, not a list"),
        ("bonus_reward", "every reward function returned None"),
    ],
)
async def test_a_failing_reward_is_an_error_episode(tmp_path: Path, reward: str, cause: str) -> None:
    """A reward function that raises, returns the wrong length, NaN or nothing ends the episode as
    `error` naming the environment and the function, never as a zero reward."""
    env = _load("EchoToolEnv", tmp_path, [{"prompt": "Echo hi."}], reward=[f"{M}:{reward}"])
    provider = ScriptedProvider([calls(call("echo", {"message": "hi"})), text("done")])
    episode = await run_episode(
        EpisodeSpec("r", "m", "scripted", 256, env.tasks()[0]), provider, env, LoopConfig()
    )
    assert episode.stop_reason is StopReason.ERROR
    assert episode.error is not None
    assert f"trl:{M}:EchoToolEnv" in episode.error.message
    assert cause in episode.error.message
    assert not episode.trainable


async def test_rows_from_a_saved_dataset_and_get_reward(tmp_path: Path) -> None:
    """A `datasets` DatasetDict saved on disk gives the rows (split chosen), and a class's own
    get_reward() adds to the reward functions' sum, as in TRL."""
    import datasets  # the dev extra's; `datasets` is imported only where a row source needs it
    data = datasets.Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": "Book Oslo."}]], "city": ["Oslo"]}
    )
    datasets.DatasetDict({"train": data, "test": data}).save_to_disk(str(tmp_path / "ds"))
    env = load_environment(
        f"trl:{M}:TypedToolsEnv",
        {"dataset": str(tmp_path / "ds"), "split": "test", "reward": [f"{M}:bonus_reward"]},
    )
    task = env.tasks()[0]
    assert task.id == "ds-1"
    args = {"city": "Oslo", "nights": 2, "kind": "hotel", "guests": ["a"], "budget": None}
    provider = ScriptedProvider(
        [calls(call("book", args)), calls(call("book", {**args, "nights": "2"})), text("booked")]
    )
    episode = await run_episode(EpisodeSpec("r", "m", "scripted", 256, task), provider, env, LoopConfig())
    assert episode.stop_reason is StopReason.DONE
    assert episode.reward == 0.5  # bonus_reward abstains, get_reward() gives 0.5
    results = [m for m in episode.messages if m.role == "tool"]
    assert results[0].text == "hotel in Oslo for 2 nights"
    assert results[1].is_error  # "2" is not an integer: refused before the method runs
    assert [c.call_id for c in episode.executed_tool_calls] == [results[0].call_id]
    with pytest.raises(ConfigError, match="name one"):
        load_environment(
            f"trl:{M}:TypedToolsEnv",
            {"dataset": str(tmp_path / "ds"), "split": "dev", "reward": [f"{M}:bonus_reward"]},
        )


async def test_a_reset_that_raises_is_an_error_episode(tmp_path: Path) -> None:
    """reset() raising (its server is down) ends the episode as `error` naming the environment and
    the cause, before any model turn."""
    env = _load("ResetFailsEnv", tmp_path, [{"prompt": "Echo hi."}], reward=[f"{M}:reward_func"])
    provider = ScriptedProvider([text("never asked")])
    episode = await run_episode(
        EpisodeSpec("r", "m", "scripted", 256, env.tasks()[0]), provider, env, LoopConfig()
    )
    assert episode.stop_reason is StopReason.ERROR
    assert episode.error is not None
    assert episode.error.message.startswith(
        f"start: EnvironmentFailure: trl:{M}:ResetFailsEnv: reset() raised"
    )
    assert "ConnectionError: env server refused the connection" in episode.error.message
    assert provider.requests == []
