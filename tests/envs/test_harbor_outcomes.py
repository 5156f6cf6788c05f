"""Typed outcomes of Harbor episodes: each infrastructure failure its own cause, timeouts reward 0."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from collector.config import LoopConfig
from collector.envs.harbor import HarborEnvironment
from collector.envs.local_sandbox import LocalBackend
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers.scripted import ScriptedProvider, calls, text
from collector.providers.scripted import call as scripted_call
from collector.record.episode import Episode
from collector.stop import StopReason
from collector.turn import Turn

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"
SOLVE = "mkdir -p /app/out && echo ready > /app/out/status.txt && echo status.txt > /app/setup.sh"


def task_with(tmp_path: Path, test_sh: str | None = None, toml: str | None = None) -> Path:
    """The shell-steps task, with its verifier or task.toml replaced."""
    target = tmp_path / "shell-steps"
    shutil.copytree(EXAMPLES / "shell-steps", target)
    if test_sh is not None:
        (target / "tests" / "test.sh").write_text(test_sh)
    if toml is not None:
        (target / "task.toml").write_text(toml)
    return target


def bash(command: str) -> Turn:
    return calls(scripted_call("bash", {"command": command}))


async def run(env: HarborEnvironment, script: list[Turn]) -> Episode:
    (task,) = env.tasks()
    spec = EpisodeSpec("run-1", "m", "scripted", 64, task)
    return await run_episode(spec, ScriptedProvider(script), env, LoopConfig())


@pytest.mark.parametrize(("test_sh", "cause", "words"), [
    ("exit 2\n", "VerifierCrashed", "exited 2 without a reward"),
    ("true\n", "RewardMissing", "wrote neither"),
    ("mkdir -p /logs/verifier\necho NaN > /logs/verifier/reward.txt\n", "RewardUnparsable", "'NaN'"),
    ("mkdir -p /logs/verifier\necho passed > /logs/verifier/reward.txt\n", "RewardUnparsable", "'passed'"),
])
async def test_a_verifier_failure_is_an_error_episode_with_its_own_cause(
    tmp_path: Path, test_sh: str, cause: str, words: str
) -> None:
    """A crashed verifier, a missing or unparsable reward: `error` naming the task and the cause."""
    env = HarborEnvironment(str(task_with(tmp_path, test_sh)), backend="local_no_isolation")
    ep = await run(env, [bash(SOLVE), text("finished")])
    assert ep.stop_reason is StopReason.ERROR
    assert ep.reward == 0.0
    assert ep.error is not None
    assert ep.error.type == cause
    assert words in ep.error.message
    assert "task shell-steps" in ep.error.message


async def test_a_sandbox_that_cannot_start_is_its_own_cause(tmp_path: Path) -> None:
    """A backend that cannot make the sandbox ends the episode as SandboxStartFailed, no turn taken."""
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    env = HarborEnvironment(str(EXAMPLES / "shell-steps"), backend=LocalBackend(base=not_a_directory))
    ep = await run(env, [text("finished")])
    assert ep.stop_reason is StopReason.ERROR
    assert ep.error is not None
    assert ep.error.type == "SandboxStartFailed"
    assert ep.turns == []


TIGHT = "[agent]\ntimeout_sec = 1.5\n[verifier]\ntimeout_sec = 30.0\n"


async def test_the_tasks_agent_timeout_ends_the_episode_as_timeout_with_reward_zero(tmp_path: Path) -> None:
    """Past task.toml's agent timeout the episode is `timeout`, reward 0, and no verifier runs."""
    env = HarborEnvironment(str(task_with(tmp_path, toml=TIGHT)), backend="local_no_isolation")
    ep = await run(env, [bash(SOLVE), bash("sleep 1"), bash("sleep 1"), bash("sleep 1"), text("finished")])
    assert ep.stop_reason is StopReason.TIMEOUT
    assert ep.reward == 0.0
    assert ep.graded_reward is None
    assert ep.timing is not None
    assert ep.timing.verifier_s is None


async def test_a_timed_out_episode_verified_for_diagnosis_keeps_reward_zero(tmp_path: Path) -> None:
    """With verify_timed_out the verifier's pass is stored in graded_reward; the reward stays 0."""
    env = HarborEnvironment(str(task_with(tmp_path, toml=TIGHT)), backend="local_no_isolation",
                            verify_timed_out=True)
    ep = await run(env, [bash(SOLVE), bash("sleep 1"), bash("sleep 1"), bash("sleep 1"), text("finished")])
    assert ep.stop_reason is StopReason.TIMEOUT
    assert ep.reward == 0.0
    assert ep.graded_reward == 1.0
