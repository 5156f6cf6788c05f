"""Harbor tasks against a real Docker daemon (started by scripts/system-setup): one container per
episode, typed outcomes, cached images, and no container left behind."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from collector.analysis.stats import compute_stats
from collector.cli import main
from collector.envs.docker_sandbox import DockerBackend
from collector.envs.harbor import EPISODE_LABEL, RUN_LABEL, HarborEnvironment
from collector.envs.harbor_task import read_task
from collector.record.shards import read_shard
from collector.storage.manifest import committed_shard_paths

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples" / "harbor"

def containers(label: str) -> list[str]:
    """Every container (running or not) carrying `label`."""
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_own_tasks_on_docker_commit_every_outcome_and_leave_no_container(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """configs/harbor_demo.toml as docs/harbor.md runs it: rewards, a cut write, typed errors, no leftover."""
    monkeypatch.chdir(REPO)
    assert main(["run", "configs/harbor_demo.toml", "--set", f"output.path={tmp_path / 'run'}"]) == 0
    rows = [
        r
        for p in committed_shard_paths(tmp_path / "run")
        for r in read_shard(p, ["task_id", "budget", "stop_reason", "reward", "error", "run_id"]).to_pylist()
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
    assert containers(f"{RUN_LABEL}={rows[0]['run_id']}") == []
    cells = compute_stats(tmp_path / "run").groups
    assert sum(g.timing.images_cached for g in cells) >= 4  # built once per task, found after
    assert all(g.error_causes.get("VerifierTimeout") == 1 for g in cells)


def test_the_image_is_built_once_and_the_container_is_labelled_and_removed(tmp_path: Path) -> None:
    """A second start finds the cached image; the container is labelled with its episode; stop removes it."""
    task = read_task(EXAMPLES / "shell-steps")
    backend = DockerBackend()

    async def scenario() -> tuple[bool, bool, str, list[str]]:
        first, times1 = await backend.start(task, {RUN_LABEL: "sys-run", EPISODE_LABEL: "ep-1"})
        await first.stop()
        box, times2 = await backend.start(task, {RUN_LABEL: "sys-run", EPISODE_LABEL: "ep-2"})
        try:
            result = await box.exec(
                "echo hi > /app/x && cat /app/x && (ping -c1 -W1 127.0.0.2 >/dev/null 2>&1 || true)", 10
            )
            running = containers(f"{EPISODE_LABEL}=ep-2")
        finally:
            await box.stop()
        return times1.image_cached, times2.image_cached, result.output, running

    _, cached_again, output, running = asyncio.run(scenario())
    assert cached_again
    assert output == "hi\n"
    assert len(running) == 1
    assert containers(f"{RUN_LABEL}=sys-run") == []


def test_a_command_past_its_timeout_is_killed_inside_the_container() -> None:
    """The timeout kills the command where it runs: the container has no `sleep` of it left."""
    task = read_task(EXAMPLES / "shell-steps")
    backend = DockerBackend()

    async def scenario() -> tuple[bool, str]:
        box, _ = await backend.start(task, {RUN_LABEL: "sys-timeout", EPISODE_LABEL: "ep"})
        try:
            cut = await box.exec("sleep 555", 1)
            left = await box.exec("ps | grep 'sleep 555' | grep -v grep || true", 10)
        finally:
            await box.stop()
        return cut.timed_out, left.output

    timed_out, left = asyncio.run(scenario())
    assert timed_out
    assert left == ""


def test_a_resumed_run_removes_the_containers_a_killed_run_left(tmp_path: Path) -> None:
    """Containers labelled with the run id (a SIGKILLed attempt's) are removed before the run goes on."""
    env = HarborEnvironment(str(EXAMPLES / "shell-steps"))
    task = read_task(EXAMPLES / "shell-steps")
    _box, _ = asyncio.run(DockerBackend().start(task, {RUN_LABEL: "sys-dead-run", EPISODE_LABEL: "ep-x"}))
    assert len(containers(f"{RUN_LABEL}=sys-dead-run")) == 1
    assert asyncio.run(env.remove_leftovers("sys-dead-run")) == 1
    assert containers(f"{RUN_LABEL}=sys-dead-run") == []


def test_a_start_cancelled_once_its_container_exists_removes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The episode's time to open ran out while `docker run` was under way: no container stays."""
    real = shutil.which("docker")
    assert real is not None
    created = tmp_path / "created"
    # A `docker run` whose container exists but whose client has not returned yet.
    (tmp_path / "docker").write_text(
        f'#!/bin/sh\nif [ "$1" = run ]; then\n    "{real}" "$@" >/dev/null && touch "{created}"\n'
        f'    exec sleep 3600\nfi\nexec "{real}" "$@"\n'
    )
    (tmp_path / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    task = read_task(EXAMPLES / "shell-steps")

    async def scenario() -> None:
        start = asyncio.create_task(
            DockerBackend().start(task, {RUN_LABEL: "sys-cancelled-start", EPISODE_LABEL: "ep"})
        )
        while not created.exists():  # the event: the container is there, the start not returned
            assert not start.done(), start
            await asyncio.sleep(0.05)
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start

    asyncio.run(asyncio.wait_for(scenario(), 120))
    assert containers(f"{RUN_LABEL}=sys-cancelled-start") == []


def test_validate_tasks_on_docker_finds_the_broken_tasks_and_leaves_no_container(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`collector validate-tasks` against Docker: oracles pass, the broken tasks are named, nothing left."""
    assert main(["validate-tasks", str(EXAMPLES)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "shell-steps: ok" in lines
    assert "long-file: ok" in lines
    assert any(line.startswith("image-fails: oracle: ImageBuildFailed") for line in lines)
    assert any(line.startswith("verifier-hangs: oracle: VerifierTimeout") for line in lines)
    labelled = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label={RUN_LABEL}", "--format", f'{{{{.Label "{RUN_LABEL}"}}}}'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert not [run for run in labelled.stdout.split() if run.startswith("validate-")]


def test_a_flooding_command_comes_back_bounded() -> None:
    """A command printing megabytes returns its head and tail within max_output_bytes, with its status."""
    task = read_task(EXAMPLES / "shell-steps")
    backend = DockerBackend(max_output_bytes=2048)

    async def scenario() -> tuple[int, str]:
        box, _ = await backend.start(task, {RUN_LABEL: "sys-flood", EPISODE_LABEL: "ep"})
        try:
            result = await box.exec("seq 1 300000", 30)
        finally:
            await box.stop()
        return result.exit_code, result.output

    code, output = asyncio.run(scenario())
    assert code == 0
    assert output.startswith("1\n2\n")
    assert output.rstrip().endswith("300000")
    assert "bytes of output left out" in output
    assert len(output.encode()) < 4096


def test_no_daemon_is_an_error_episode_named_sandbox_start_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no daemon answering, the episode ends `error` as SandboxStartFailed, naming the task."""
    from collector.config import LoopConfig
    from collector.episode.loop import EpisodeSpec, run_episode
    from collector.providers.scripted import ScriptedProvider, text

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    env = HarborEnvironment(str(EXAMPLES / "shell-steps"))
    (task,) = env.tasks()
    episode = asyncio.run(
        run_episode(
            EpisodeSpec("r", "m", "scripted", 64, task), ScriptedProvider([text("done")]), env, LoopConfig()
        )
    )
    assert episode.stop_reason == "error"
    assert episode.error is not None
    assert episode.error.type == "SandboxStartFailed"
    assert "task shell-steps" in episode.error.message
