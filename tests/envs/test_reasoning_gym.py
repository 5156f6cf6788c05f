"""`reasoning_gym`: reasoning-gym's tasks as a text-action environment, graded by its scorers."""

from __future__ import annotations

from pathlib import Path

import pytest
import reasoning_gym as rg

from collector.cli import main
from collector.config import LoopConfig
from collector.envs.loading import load_environment
from collector.envs.reasoning_gym import ReasoningGymEnv
from collector.episode.loop import EpisodeSpec, run_episode
from collector.errors import ConfigError
from collector.providers.scripted import ScriptedProvider, Step, cut, text
from collector.record.episode import Episode
from collector.stop import StopReason


def _env(**options: object) -> ReasoningGymEnv:
    env = load_environment("reasoning_gym", {"dataset": "leg_counting", "size": 3, "seed": 1, **options})
    assert isinstance(env, ReasoningGymEnv)
    return env


async def _run(env: ReasoningGymEnv, script: list[Step], **loop: object) -> Episode:
    spec = EpisodeSpec("run", "model", "scripted", 64, env.tasks()[0], env_name=env.name)
    return await run_episode(spec, ScriptedProvider(script), env, LoopConfig.model_validate(loop))


def test_tasks_are_reasoning_gyms_own_entries_for_the_seed() -> None:
    """The tasks are `reasoning_gym.create_dataset(name, size, seed)`'s entries, in order, asked
    with reasoning-gym's default system prompt."""
    env = _env()
    expected = rg.create_dataset("leg_counting", size=3, seed=1)
    assert [t.metadata["answer"] for t in env.tasks()] == [e["answer"] for e in expected]
    prompt = env.tasks()[0].prompt
    assert isinstance(prompt, list)
    assert prompt[0].role == "system"
    assert "<answer>" in prompt[0].text
    assert prompt[1].text == expected[0]["question"]


async def test_answers_are_graded_by_reasoning_gyms_scorer() -> None:
    """A right answer in the answer tag scores 1.0, a wrong one 0.0, and an answer holding the
    oracle among other text scores what reasoning-gym's scorer gives it (a partial credit)."""
    env = _env()
    answer = env.tasks()[0].metadata["answer"]
    right = await _run(env, [text(f"Counting... <answer>{answer}</answer>")])
    wrong = await _run(env, [text("<answer>-1</answer>")])
    partial = await _run(env, [text(f"<answer>{answer} legs</answer>")])
    assert right.stop_reason is StopReason.DONE
    assert right.reward == 1.0
    assert wrong.reward == 0.0
    entry = rg.create_dataset("leg_counting", size=3, seed=1)[0]
    scorer = rg.create_dataset("leg_counting", size=3, seed=1).score_answer(f"{answer} legs", entry)
    assert 0.0 < scorer < 1.0
    assert partial.reward == pytest.approx(scorer)


async def test_a_cut_answer_is_length_and_never_scored() -> None:
    """A reply cut by the output cap is `length` at reward 0 even when the text so far holds the
    right answer, and the grader never sees it (`graded_reward` stays empty)."""
    env = _env()
    answer = env.tasks()[0].metadata["answer"]
    episode = await _run(env, [cut(text=f"<answer>{answer}</answer> because the lobst")])
    assert episode.stop_reason is StopReason.LENGTH
    assert episode.reward == 0.0
    assert episode.graded_reward is None


def test_an_unknown_dataset_is_one_line_naming_it_and_the_closest_names() -> None:
    """A dataset name reasoning-gym does not register is a one-line config error naming the
    option, the name and what it was probably meant to be."""
    with pytest.raises(ConfigError) as caught:
        _env(dataset="leg_countin")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("env.options.dataset: reasoning_gym has no dataset 'leg_countin'")
    assert "leg_counting" in message


def test_a_parameter_the_dataset_does_not_take_is_one_line() -> None:
    """A `config` key the dataset's config class does not take is refused in one line naming it."""
    with pytest.raises(ConfigError, match=r"^env\.options\.config: .*'leg_counting'.*bogus"):
        _env(config={"bogus": 3})


def test_validate_refuses_an_unknown_dataset_before_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    """`collector validate` on a config naming an unknown dataset exits non-zero with one line."""
    config = Path(__file__).resolve().parents[2] / "configs" / "reasoning_gym.toml"
    assert main(["validate", str(config), "--set", "env.options.dataset=no_such_task"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "no dataset 'no_such_task'" in err


async def test_a_recorded_answer_is_regraded_by_the_same_scorer() -> None:
    """`collector regrade` rebuilds the world from the recorded final text alone: a right
    answer scores 1.0 again, a wrong one 0.0."""
    env = _env()
    task = env.tasks()[0]
    answer = task.metadata["answer"]
    episode = {"episode_id": "e", "run_id": "r", "task_id": task.id, "model": "m", "provider": "p",
               "budget": 64, "sample": 0, "seed": 0, "env": env.name}
    assert await env.regrade(task, episode, [], f"<answer>{answer}</answer>") == 1.0
    assert await env.regrade(task, episode, [], "<answer>-1</answer>") == 0.0
