"""The `harness` environment kind's configuration, command templates, environment and rewards (in-process)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from collector.config import LoopConfig, RunConfig
from collector.envs.base import Task
from collector.envs.loading import load_environment
from collector.episode.loop import EpisodeSpec
from collector.errors import ConfigError
from collector.harness.env import HarnessEnv, check_harness_config, harness_of
from collector.harness.runner import HarnessFailed, _reward, harness_argv, harness_environment


def _env(**options: object) -> HarnessEnv:
    env = load_environment("harness", {"command": ["run-agent", "{task}"], **options})
    found = harness_of(env)
    assert found is not None
    return found


def test_the_harness_kind_is_a_builtin_with_inline_tasks() -> None:
    """`env.name = "harness"` loads the kind; its tasks come from `options.tasks`."""
    env = _env(tasks=[{"id": "t1", "prompt": "fix the bug", "metadata": {"repo": "x"}}])
    assert [(t.id, t.prompt, dict(t.metadata)) for t in env.tasks()] == [("t1", "fix the bug", {"repo": "x"})]
    assert env.settings.command == ("run-agent", "{task}")
    assert env.settings.label == "harness 'run-agent'"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"command": None}, "env.options.command: the harness's command line is required"),
        ({"command": ""}, "env.options.command: is empty"),
        ({"reward": "vibes"}, "env.options.reward: 'vibes' is not one of exit_status, reward_file, grader"),
        ({"reward": "grader"}, 'env.options.grader: reward = "grader" needs grader = "module:function"'),
        ({"grace_s": -1}, "env.options.grace_s: must be a positive number"),
        ({"pass_env": "HOME"}, "env.options.pass_env: must be a list of variable names"),
        ({"tasks": [{"id": "x"}]}, "env.options.tasks[0]: missing column 'prompt'"),
    ],
)
def test_bad_options_are_one_line_naming_the_option(options: dict[str, object], message: str) -> None:
    """A harness option the kind cannot use is refused before any episode, naming the option."""
    with pytest.raises(ConfigError) as info:
        _env(**options)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_passing_the_provider_key_to_the_harness_is_refused() -> None:
    """`pass_env` may not name the provider's key variable: the harness gets its token instead."""
    cfg = RunConfig.model_validate(
        {
            "provider": {"kind": "chat", "base_url": "http://h/v1", "api_key_env": "OPENAI_API_KEY"},
            "sweep": {"models": ["m"], "budgets": [64]},
            "env": {"name": "harness", "options": {"command": "a"}},
        }
    )
    with pytest.raises(ConfigError, match=r"^env.options.pass_env: OPENAI_API_KEY is the provider's key"):
        check_harness_config(cfg, _env(pass_env=["OPENAI_API_KEY"]))
    check_harness_config(cfg, _env(pass_env=["PYTHONPATH"]))


def _spec(task: Task) -> EpisodeSpec:
    return EpisodeSpec(run_id="r", model="m1", provider_kind="sim", budget=64, task=task)


def test_command_templates_are_filled_per_argument(tmp_path: Path) -> None:
    """`{task}` stays one argument however many spaces it holds; task metadata is reachable by key."""
    env = _env(command="agent --task {task} --repo {metadata[repo]} --url {base_url} --cap {budget}")
    argv = harness_argv(
        env.settings, _spec(Task("t", "fix the flaky test", {"repo": "r1"})), tmp_path, "http://127.0.0.1:9"
    )
    assert argv == [
        "agent",
        "--task",
        "fix the flaky test",
        "--repo",
        "r1",
        "--url",
        "http://127.0.0.1:9/v1",
        "--cap",
        "64",
    ]
    with pytest.raises(HarnessFailed, match=r"^harness 'agent': env.options.command: cannot fill 'repo'"):
        harness_argv(env.settings, _spec(Task("t", "p")), tmp_path, "http://h")


def test_the_harness_environment_is_an_allow_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only allow-listed and named variables pass, never a credential's value; the token is the key."""
    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.setenv("SOME_CLOUD_TOKEN", "secret-value-1")
    monkeypatch.setenv("WANTED", "sk-run-key")
    env = _env(pass_env=["WANTED"], env={"FIXED": "1"})
    variables = harness_environment(
        env.settings, "ep-token", "http://127.0.0.1:5", tmp_path, "t1", ("sk-run-key",)
    )
    assert variables["PATH"] == "/usr/bin"
    assert variables["FIXED"] == "1"
    assert "SOME_CLOUD_TOKEN" not in variables
    assert "WANTED" not in variables  # its value is one of the run's credentials
    assert (variables["OPENAI_BASE_URL"], variables["OPENAI_API_KEY"]) == (
        "http://127.0.0.1:5/v1",
        "ep-token",
    )
    assert (variables["ANTHROPIC_BASE_URL"], variables["ANTHROPIC_API_KEY"]) == (
        "http://127.0.0.1:5",
        "ep-token",
    )


def grade_answer_file(workdir: Path, final_text: str | None, task: Task) -> float:
    """A grader over the working directory (used by the test below through its import path)."""
    return 1.0 if (workdir / "answer.txt").read_text().strip() == task.metadata["answer"] else 0.0


def test_rewards_come_from_the_exit_status_a_reward_file_or_a_grader(tmp_path: Path) -> None:
    """Each reward source gives the episode's reward; an unreadable one is the harness's failure."""
    spec = _spec(Task("t", "p", {"answer": "42"}))
    loop = LoopConfig()
    assert asyncio.run(_reward(_env().settings, spec, tmp_path, None, 0, loop)) == 1.0
    assert asyncio.run(_reward(_env().settings, spec, tmp_path, None, 1, loop)) == 0.0
    file_env = _env(reward="reward_file")
    with pytest.raises(HarnessFailed, match=r"reward file reward.txt: FileNotFoundError"):
        asyncio.run(_reward(file_env.settings, spec, tmp_path, None, 0, loop))
    (tmp_path / "reward.txt").write_text("0.25\n")
    assert asyncio.run(_reward(file_env.settings, spec, tmp_path, None, 0, loop)) == 0.25
    graded = _env(reward="grader", grader=f"{__name__}:grade_answer_file")
    (tmp_path / "answer.txt").write_text("42")
    assert asyncio.run(_reward(graded.settings, spec, tmp_path, "42", 0, loop)) == 1.0
    (tmp_path / "answer.txt").write_text("41")
    assert asyncio.run(_reward(graded.settings, spec, tmp_path, "41", 0, loop)) == 0.0
