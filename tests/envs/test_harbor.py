"""Harbor tasks on the local (no isolation) sandbox backend: tools, verifier reward, typed outcomes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from collector.cli import main
from collector.config import LoopConfig, load_config
from collector.envs.base import Task
from collector.envs.harbor import HarborEnvironment, parse_reward
from collector.episode.loop import EpisodeSpec, run_episode
from collector.errors import RewardUnparsable, SandboxStartFailed
from collector.providers.scripted import ScriptedProvider, calls, cut, text
from collector.providers.scripted import call as scripted_call
from collector.record.shards import read_shard
from collector.run.job import run_job
from collector.stop import StopReason
from collector.storage.manifest import committed_shard_paths
from collector.turn import Turn

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"


def local_env(path: Path = EXAMPLES, **options: object) -> HarborEnvironment:
    return HarborEnvironment(str(path), backend="local_no_isolation", **options)  # type: ignore[arg-type]


def bash(command: str, **more: object) -> Turn:
    return calls(scripted_call("bash", {"command": command, **more}))


def write(path: str, content: str) -> Turn:
    return calls(scripted_call("write_file", {"path": path, "content": content}))


def answer() -> Turn:
    return text("finished")


async def episode(env: HarborEnvironment, task_id: str, script: list[Turn], **loop: object):  # type: ignore[no-untyped-def]
    task = next(t for t in env.tasks() if t.id == task_id)
    spec = EpisodeSpec("run-1", "m", "scripted", 64, task)
    return await run_episode(spec, ScriptedProvider(script), env, LoopConfig(**loop))  # type: ignore[arg-type]


async def test_tools_run_in_the_sandbox_and_the_verifier_gives_the_reward() -> None:
    """bash and write_file act on the episode's sandbox; after `done` the verifier's reward is the reward."""
    env = local_env()
    solved = await episode(
        env,
        "shell-steps",
        [
            bash("mkdir -p /app/out && echo ready > /app/out/status.txt && cat out/status.txt"),
            write("setup.sh", "echo ready > /app/out/status.txt\n"),
            answer(),
        ],
    )
    assert solved.stop_reason is StopReason.DONE
    assert solved.reward == 1.0
    results = [m.text for m in solved.messages if m.role == "tool"]
    assert results[0] == "[exit status 0]\nready\n"
    assert results[1].startswith("wrote 33 bytes to /app/setup.sh")
    untouched = await episode(env, "shell-steps", [answer()])
    assert untouched.stop_reason is StopReason.DONE
    assert untouched.reward == 0.0


async def test_a_cut_write_file_never_reaches_the_sandbox_and_no_verifier_runs() -> None:
    """A turn cut by the cap ends the episode `length`, reward 0: the file is not written, no verdict."""
    env = local_env()
    partial = scripted_call("write_file", {"path": "/app/site/index.txt", "content": "row 01 alpha, row 02"})
    ep = await episode(env, "long-file", [cut(partial)], stop_on=["length"])
    assert ep.stop_reason is StopReason.LENGTH
    assert ep.reward == 0.0
    assert ep.graded_reward is None
    assert ep.executed_tool_calls == []


async def test_bash_reports_the_exit_status_and_bounds_flooding_output() -> None:
    """A failing command says its status; a flood comes back as head and tail within max_output_bytes."""
    env = local_env(max_output_bytes=1024)
    ep = await episode(env, "shell-steps", [bash("seq 100000"), bash("exit 4"), answer()])
    flood, failed = (m.text for m in ep.messages if m.role == "tool")
    assert flood.startswith("[exit status 0]\n1\n2\n")
    assert flood.rstrip().endswith("100000")
    assert "bytes of output left out" in flood
    assert len(flood.encode()) < 1200
    assert failed.startswith("[exit status 4]")


async def test_a_command_past_its_timeout_is_killed_and_said_so() -> None:
    """A command that outlives its `timeout` returns as timed out; the episode goes on."""
    env = local_env()
    ep = await episode(env, "shell-steps", [bash("sleep 30", timeout=1), answer()])
    (result,) = (m.text for m in ep.messages if m.role == "tool")
    assert result.startswith("[timed out after 1 s and killed]")
    assert ep.stop_reason is StopReason.DONE


@pytest.mark.parametrize(
    ("text", "source"),
    [
        (b"nan", "/logs/verifier/reward.txt"),
        (b"passed", "/logs/verifier/reward.txt"),
        (b"1.5", "/logs/verifier/reward.txt"),
        (b'{"reward": "high"}', "/logs/verifier/reward.json"),
    ],
)
def test_a_reward_that_is_not_a_number_in_range_is_unparsable(text: bytes, source: str) -> None:
    """Text, NaN or a value outside [0, 1] in the reward file is RewardUnparsable naming the task."""
    with pytest.raises(RewardUnparsable, match="task t1:"):
        parse_reward("t1", source, text)
    assert parse_reward("t1", "/logs/verifier/reward.json", b'{"reward": 0.25}') == 0.25


def test_a_run_of_the_own_tasks_commits_every_episode_with_its_outcome(tmp_path: Path) -> None:
    """`collector run` on the simulator: solved ones reward 1, a long write cut at 64, broken ones error."""
    config = tmp_path / "harbor.toml"
    config.write_text(
        'name = "harbor_test"\n[provider]\nkind = "sim"\n'
        '[sweep]\nmodels = ["sim-perfect"]\nbudgets = [64, 4096]\n'
        f'[env]\nname = "harbor"\n[env.options]\npath = "{EXAMPLES}"\nbackend = "local_no_isolation"\n'
        f'[ray]\npool = "in_process"\nworkers = 1\n[output]\npath = "{tmp_path / "run"}"\n'
    )
    assert main(["run", str(config)]) == 0
    rows = [
        r
        for p in committed_shard_paths(tmp_path / "run")
        for r in read_shard(p, ["task_id", "budget", "stop_reason", "reward", "error"]).to_pylist()
    ]
    got = {
        (r["task_id"], r["budget"]): (r["stop_reason"], r["reward"], (r["error"] or {}).get("type"))
        for r in rows
    }
    assert got == {
        ("shell-steps", 64): ("done", 1.0, None),
        ("shell-steps", 4096): ("done", 1.0, None),
        ("long-file", 64): ("length", 0.0, None),
        ("long-file", 4096): ("done", 1.0, None),
        ("verifier-hangs", 64): ("error", 0.0, "VerifierTimeout"),
        ("verifier-hangs", 4096): ("error", 0.0, "VerifierTimeout"),
        ("image-fails", 64): ("error", 0.0, "ImageBuildFailed"),
        ("image-fails", 4096): ("error", 0.0, "ImageBuildFailed"),
    }


def harbor_config(tmp_path: Path, path: Path = EXAMPLES) -> Path:
    config = tmp_path / "harbor.toml"
    config.write_text(
        'name = "harbor_test"\n[provider]\nkind = "sim"\n'
        '[sweep]\nmodels = ["sim-perfect"]\nbudgets = [4096]\n'
        f'[env]\nname = "harbor"\n[env.options]\npath = "{path}"\nbackend = "local_no_isolation"\n'
        f'[ray]\npool = "in_process"\nworkers = 1\n[output]\npath = "{tmp_path / "run"}"\n'
    )
    return config


def committed_count(run: Path) -> int:
    return sum(read_shard(p, ["episode_id"]).num_rows for p in committed_shard_paths(run))


def test_the_run_sweeps_its_sandboxes_when_it_starts_and_again_once_every_episode_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second sweep finds what a create still in flight at the first one left (its
    system test: tests/system/harbor/test_docker_resume.py); it runs after the last commit."""
    seen: list[tuple[str, int]] = []

    async def sweep(self: HarborEnvironment, run_id: str) -> int:
        seen.append((run_id, committed_count(tmp_path / "run")))
        return 0

    monkeypatch.setattr(HarborEnvironment, "remove_leftovers", sweep)
    result = run_job(load_config(harbor_config(tmp_path, EXAMPLES / "shell-steps")), show_progress=False)
    assert result.committed == 1
    assert seen == [(result.run_id, 0), (result.run_id, 1)]


def test_a_sweep_that_fails_at_the_end_is_a_warning_not_the_run_s_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The episodes are committed; the warning says the next run removes what is left."""
    sweeps = 0

    async def sweep(self: HarborEnvironment, run_id: str) -> int:
        nonlocal sweeps
        sweeps += 1
        if sweeps == 2:
            raise SandboxStartFailed("docker is not answering")
        return 0

    monkeypatch.setattr(HarborEnvironment, "remove_leftovers", sweep)
    result = run_job(load_config(harbor_config(tmp_path, EXAMPLES / "shell-steps")), show_progress=False)
    assert result.committed == 1
    assert [w for w in result.warnings if "sandboxes" in w] == [
        "the run's sandboxes could not be removed at its end (SandboxStartFailed: docker is not "
        "answering); the next run of it removes them"
    ]


def test_tasks_prompt_is_the_instruction(tmp_path: Path) -> None:
    """Each task's instruction.md is its prompt, and the task id is the directory's name."""
    shutil.copytree(EXAMPLES / "shell-steps", tmp_path / "one")
    (tmp_path / "one" / "instruction.md").write_text("Do the thing.\n")
    (task,) = local_env(tmp_path / "one").tasks()
    assert task == Task(id="one", prompt="Do the thing.", metadata=task.metadata)
