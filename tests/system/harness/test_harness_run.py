"""Harness episodes run by the worker: real child processes against the gateway and the simulator.

The worker is driven in this process (no Ray); each harness is a child process started by the
runner, so these tests belong to the system tier.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from collector.config import RunConfig
from collector.envs.arithmetic import ArithmeticEnv
from collector.harness.runner import _group_alive
from collector.record.episode import Episode
from collector.record.shards import episodes_from_table, episodes_to_table
from collector.run.plan import plan_work
from collector.run.simlaunch import provider_urls
from collector.run.worker import EpisodeWorker, WorkerSetup
from collector.sim.truth import call_tokens_for
from collector.stop import StopReason

ROOT = Path(__file__).resolve().parents[3]
LOOP = ROOT / "examples" / "harnesses" / "openai_tool_loop.py"
MISBEHAVING = Path(__file__).with_name("misbehaving_harness.py")
CUT = 9
"""The SDK loops' cutting budget: the length of their one task's call (arith-0000, `7 - 7`)."""
CUT_SEED = 7
"""An episode seed whose sim-hidden-cut draw at CUT has no preamble, on every SDK loop's
requests (the simulator's reply is a function of its seed and the request)."""


def _config(
    tmp_path: Path,
    command: list[str],
    models: list[str],
    budgets: list[int],
    tasks: int = 6,
    provider: dict[str, Any] | None = None,
    **options: Any,
) -> RunConfig:
    task_file = tmp_path / "tasks.jsonl"
    rows = [{"id": t.id, "prompt": t.prompt} for t in ArithmeticEnv(num_tasks=tasks, seed=5).tasks()]
    task_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "work").mkdir(exist_ok=True)
    return RunConfig.model_validate(
        {
            "name": "harness-test",
            "sweep": {"models": models, "budgets": budgets},
            "env": {
                "name": "harness",
                "task_file": str(task_file),
                "python_path": [str(LOOP.parent)],
                "options": {
                    "command": command,
                    "workdir_root": str(tmp_path / "work"),
                    "keep_workdir": True,
                    "grace_s": 2,
                    **options,
                },
            },
            "provider": provider or {"kind": "sim"},
            "ray": {"workers": 1, "episodes_in_flight": 4},
            "output": {"path": str(tmp_path / "run")},
        }
    )


def _run(cfg: RunConfig, seed: int | None = None) -> list[Episode]:
    """The plan's episodes run by one worker; with `seed`, every episode has that seed instead
    of one derived from the run id (which hashes the temporary paths: a new draw every run)."""
    plan = plan_work(cfg)
    items = [item if seed is None else dataclasses.replace(item, seed=seed) for item in plan.items]

    async def run() -> list[Episode]:
        with provider_urls(plan.providers, cfg.seed) as urls:
            worker = EpisodeWorker(WorkerSetup(cfg, plan.run_id, urls, "w"))
            try:
                return await worker.run_batch(items)
            finally:
                await worker.close()

    return asyncio.run(run())


def _workdir(tmp_path: Path, episode: Episode) -> Path:
    (found,) = (tmp_path / "work").glob(f"harness-{episode.episode_id[:12]}-*")
    return found / "work"


@pytest.mark.parametrize(
    "loop",
    [
        ["openai_tool_loop.py", "{task}"],
        ["openai_tool_loop.py", "{task}", "--stream"],
        ["anthropic_tool_loop.py", "{task}"],
        ["anthropic_tool_loop.py", "{task}", "--stream"],
        ["agents_runner.py", "{task}"],
    ],
    ids=["openai", "openai-stream", "anthropic", "anthropic-stream", "openai-agents"],
)
def test_an_sdk_tool_loop_runs_as_episodes_and_never_runs_a_call_of_a_cut_turn(
    tmp_path: Path, loop: list[str]
) -> None:
    """Each harness episode is one shard row; no execution the harness logged comes from a cut turn.

    At budget 9 the task's one call is exactly 9 tokens (`call_tokens_for`), so a turn that
    starts with it is cut with the call whole and only its end missing: a call the harness
    runs if the gateway lets it through. sim-perfect (no preamble, for every seed) reports that
    cut as `length`; sim-hidden-cut as `tool_calls`, with the episodes' seed pinned to one whose
    draw has no preamble either (the cut turn's record below says so). At budget 400 both
    finish, each running its call: four episodes, each harness a process that imports its SDK
    (one to three seconds of CPU), every one of them needed."""
    command = [sys.executable, str(LOOP.parent / loop[0]), *loop[1:]]
    cfg = _config(tmp_path, command, ["sim-perfect", "sim-hidden-cut"], [CUT, 400], tasks=1)
    (task,) = ArithmeticEnv(num_tasks=1, seed=5).tasks()
    for model in ("sim-perfect", "sim-hidden-cut"):
        assert call_tokens_for(model, [("calculator", {"expression": task.metadata["expression"]})]) == CUT
    episodes = _run(cfg, seed=CUT_SEED)
    assert len(episodes) == 2 * 2
    back = episodes_from_table(episodes_to_table(episodes))  # the shard row, and back
    assert [e.episode_id for e in back] == [e.episode_id for e in episodes]
    logged = 0
    for episode in back:
        # Cut: a length signal on its record, whether or not the gateway withheld the turn.
        cut_turns = {t.index for t in episode.turns if t.discarded or t.length_signals}
        turn_of = {c.call_id: c.turn_index for c in episode.executed_tool_calls}
        assert not set(turn_of.values()) & cut_turns  # the gateway returned no call of a cut turn
        log = _workdir(tmp_path, episode) / "executions.jsonl"
        ran = [json.loads(line)["id"] for line in log.read_text().splitlines()] if log.exists() else []
        assert set(ran) <= set(turn_of)  # everything the harness ran was a call the gateway returned
        assert not {turn_of[i] for i in ran} & cut_turns  # ...and none of a cut turn
        logged += len(ran)
        if episode.stop_reason is StopReason.LENGTH:
            assert episode.turns[-1].discarded
            assert episode.reward == 0.0
        if episode.stop_reason is StopReason.DONE:
            assert episode.reward == 1.0  # exit status 0
            asked = None if loop[0] == "agents_runner.py" else 4096  # the Runner asks for no cap
            assert all(t.harness_asked_cap == asked for t in episode.turns)
            assert all(t.max_output_tokens == episode.budget for t in episode.turns)
    assert logged == 2  # each finished episode ran its call; the cut ones ran nothing
    # What made those checks bite: both cells at CUT end on a cut turn holding the whole call,
    # one cut reported, one hidden; both at 400 finish.
    cut = {e.model: e.turns[-1] for e in back if e.stop_reason is StopReason.LENGTH}
    assert {m: (t.raw_finish_reason, t.num_tool_calls, t.output_tokens) for m, t in cut.items()} == {
        "sim-perfect": ("length", 1, CUT), "sim-hidden-cut": ("tool_calls", 1, CUT)}
    assert {e.stop_reason for e in back if e.budget == 400} == {StopReason.DONE}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper is not running
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_harness_that_hangs_after_a_cut_is_stopped_with_its_children(tmp_path: Path) -> None:
    """The gateway ends the episode at the cut turn; the harness and the child it forked are both stopped."""
    cfg = _config(
        tmp_path,
        [sys.executable, str(MISBEHAVING), "hang-after-cut", "{task}"],
        ["sim-verbose"],
        [8],
        tasks=1,
        timeout_s=120,
    )
    started = time.monotonic()
    (episode,) = _run(cfg)
    assert time.monotonic() - started < 60  # not the harness's 300 s, nor the limit's 120 s
    assert episode.stop_reason is StopReason.LENGTH
    child = int((_workdir(tmp_path, episode) / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_a_harness_group_left_as_zombies_is_gone_to_the_runner() -> None:
    """A group whose members have all exited but wait to be reaped (zombies: what the supervisor's
    own SIGKILL leaves for init, which may reap late or, as a container's PID 1 without an init,
    never) is not alive to the runner, so its stop does not wait out `grace_s` on them; a group
    with a running member is."""
    assert sys.platform == "linux"  # /proc
    member = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                              stdin=subprocess.PIPE, start_new_session=True)
    try:
        assert _group_alive(member.pid)
        assert member.stdin is not None
        member.stdin.close()  # the event: it exits
        os.waitid(os.P_PID, member.pid, os.WEXITED | os.WNOWAIT)  # exited, left unreaped: a zombie
        assert not _alive(member.pid)
        assert not _group_alive(member.pid)
    finally:
        member.wait()


@pytest.mark.parametrize(
    ("mode", "options", "reason", "message"),
    [
        ("crash", {}, StopReason.ERROR, "exited with status 3; stderr: boom: the harness fell over"),
        ("silent", {}, StopReason.ERROR, "exited without calling the model"),
        ("sleep", {"timeout_s": 1}, StopReason.TIMEOUT, None),
    ],
)
def test_a_harness_that_crashes_stays_silent_or_hangs_ends_typed(
    tmp_path: Path, mode: str, options: dict[str, Any], reason: StopReason, message: str | None
) -> None:
    """Each misbehaviour ends as its own stop reason, with one line naming the harness and the cause."""
    cfg = _config(
        tmp_path,
        [sys.executable, str(MISBEHAVING), mode, "{task}"],
        ["sim-perfect"],
        [400],
        tasks=1,
        **options,
    )
    (episode,) = _run(cfg)
    assert episode.stop_reason is reason
    assert not episode.trainable
    if message is not None:
        assert episode.error is not None
        assert episode.error.message.startswith("harness 'python")
        assert message in episode.error.message


def test_the_harness_never_sees_the_provider_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness's environment is the allow-list and its token; the provider's key stays in the worker."""
    monkeypatch.setenv("HARNESS_TEST_PROVIDER_KEY", "sk-provider-secret-123456")
    monkeypatch.setenv("HARNESS_TEST_OTHER", "not allowed")
    cfg = _config(
        tmp_path,
        [sys.executable, str(MISBEHAVING), "env", "{task}"],
        ["sim-perfect"],
        [400],
        tasks=1,
        provider={"kind": "sim", "api_key_env": "HARNESS_TEST_PROVIDER_KEY"},
        pass_env=["HARNESS_TEST_ALLOWED"],
    )
    monkeypatch.setenv("HARNESS_TEST_ALLOWED", "yes")
    (episode,) = _run(cfg)
    assert episode.stop_reason is StopReason.DONE
    seen = json.loads((_workdir(tmp_path, episode) / "env.json").read_text())
    assert "sk-provider-secret-123456" not in json.dumps(seen)
    assert "HARNESS_TEST_OTHER" not in seen
    assert seen["HARNESS_TEST_ALLOWED"] == "yes"
    assert seen["OPENAI_API_KEY"].startswith("ep-")
    assert seen["OPENAI_BASE_URL"].startswith("http://127.0.0.1:")


def test_a_harness_workdir_is_removed_after_its_episode_unless_kept(tmp_path: Path) -> None:
    """Without `keep_workdir` (the default) nothing of an episode's working directory is left."""
    loop = Path(__file__).with_name("stdlib_tool_loop.py")
    cfg = _config(tmp_path, [sys.executable, "-S", str(loop), "{task}"], ["sim-perfect"], [400], tasks=2,
                  keep_workdir=False)
    episodes = _run(cfg)
    assert [e.stop_reason for e in episodes] == [StopReason.DONE] * 2
    assert all(e.executed_tool_calls for e in episodes)  # each ran its call in its directory
    assert list((tmp_path / "work").iterdir()) == []


def test_a_sigkill_of_the_worker_takes_its_harness_and_the_harness_children_with_it(tmp_path: Path) -> None:
    """With the worker killed by SIGKILL mid-episode, its harness and the child it forked die too."""
    import signal

    worker = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("sigkill_worker.py")), str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 60
        pids: list[Path] = []
        while (
            time.monotonic() < deadline and not pids
        ):  # the episode is in flight: the harness wrote its pids
            pids = list(tmp_path.glob("harness-*/work/child.pid"))
            time.sleep(0.05)
        assert pids, "the harness never started"
        work = pids[0].parent
        while not (work / "harness.pid").exists():
            time.sleep(0.01)
        harness, child = int((work / "harness.pid").read_text()), int((work / "child.pid").read_text())
        assert _alive(harness)
        assert _alive(child)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        deadline = time.monotonic() + 10  # the supervisor's grace is 1 s
        while (_alive(harness) or _alive(child)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(harness)
        assert not _alive(child)
    finally:
        if worker.poll() is None:
            worker.kill()
