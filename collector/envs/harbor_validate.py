"""Checking Harbor tasks before a sweep: the oracle must pass and an untouched sandbox must not.

`collector validate-tasks PATH` runs, for each task directory, in two fresh sandboxes:

1. the oracle: `solution/` copied to `/solution`, `bash /solution/solve.sh` under the task's
   agent timeout, then the verifier: reward 1 expected;
2. the verifier on an untouched sandbox: reward 0 expected (a verifier that passes a task
   nobody did rewards every episode, whatever the model wrote).

A task fails when either expectation fails or when anything on the way does (the image does
not build, the verifier times out, the reward is missing): each named in one line with the
typed cause, so a broken task is found before it costs a sweep. A task with no
`solution/solve.sh` is checked for the second part only, and says so. Sandboxes carry the
labels of a validation run and are stopped whatever happens.

Tests: tests/envs/test_harbor_validate.py, tests/system/harbor/test_docker.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from collector.envs.harbor import EPISODE_LABEL, RUN_LABEL, load_backend, run_verifier
from collector.envs.harbor_task import HarborTask, read_tasks
from collector.envs.sandbox import SandboxBackend
from collector.errors import EnvironmentFailure


@dataclass(slots=True)
class TaskVerdict:
    """What validation found for one task: empty `problems` is a task fit for a sweep."""

    task: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


async def validate_task(task: HarborTask, backend: SandboxBackend, run_label: str) -> TaskVerdict:
    """The oracle and the untouched check of one task (see the module docstring)."""
    verdict = TaskVerdict(task.name)
    if task.has_solution:
        reward = await _reward(task, backend, run_label, "oracle", verdict)
        if reward is not None and reward != 1.0:
            verdict.problems.append(f"the oracle (solution/solve.sh) scores {reward:g}, not 1")
    else:
        verdict.notes.append("no solution/solve.sh: the oracle was not run")
    reward = await _reward(task, backend, run_label, "untouched", verdict)
    if reward is not None and reward != 0.0:
        verdict.problems.append(f"an untouched sandbox scores {reward:g}, not 0: "
                                "the verifier passes a task nobody did")
    return verdict


async def _reward(task: HarborTask, backend: SandboxBackend, run_label: str, phase: str,
                  verdict: TaskVerdict) -> float | None:
    """The verifier's reward after `phase`, or None with the failure added to `verdict`."""
    labels = {RUN_LABEL: run_label, EPISODE_LABEL: f"{task.name}-{phase}"}
    try:
        box, _ = await backend.start(task, labels)
    except EnvironmentFailure as exc:
        verdict.problems.append(f"{phase}: {type(exc).__name__}: {exc}")
        return None
    try:
        if phase == "oracle":
            for file in sorted(p for p in task.solution_dir.rglob("*") if p.is_file()):
                where = "/solution/" + file.relative_to(task.solution_dir).as_posix()
                await box.write(where, file.read_bytes())
            solved = await box.exec("bash /solution/solve.sh", task.agent_timeout_s, task.environment_env)
            if solved.timed_out:
                verdict.problems.append(f"oracle: solution/solve.sh ran past the agent timeout "
                                        f"({task.agent_timeout_s:g} s)")
                return None
            if solved.exit_code != 0:
                verdict.notes.append(f"oracle: solution/solve.sh exited {solved.exit_code}")
        return await run_verifier(box, task)
    except EnvironmentFailure as exc:
        verdict.problems.append(f"{phase}: {type(exc).__name__}: {exc}")
        return None
    finally:
        await box.stop()


async def validate_tasks(path: str | Path, backend: str | SandboxBackend = "docker",
                         concurrency: int = 2) -> list[TaskVerdict]:
    """Every task under `path`, validated `concurrency` at a time, in the tasks' order."""
    tasks = read_tasks(path)
    chosen = backend if isinstance(backend, SandboxBackend) else load_backend(backend)
    run_label = f"validate-{uuid.uuid4().hex[:12]}"
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(task: HarborTask) -> TaskVerdict:
        async with gate:
            return await validate_task(task, chosen, run_label)

    try:
        return list(await asyncio.gather(*(one(t) for t in tasks)))
    finally:
        await chosen.remove_labelled({RUN_LABEL: run_label})


def verdict_lines(verdicts: Sequence[TaskVerdict]) -> list[str]:
    """One line per task (`ok`, or each problem), then a summary line."""
    lines = []
    for v in verdicts:
        if v.ok:
            lines.append(f"{v.task}: ok" + "".join(f" ({note})" for note in v.notes))
        lines.extend(f"{v.task}: {problem}" for problem in v.problems)
    broken = sum(not v.ok for v in verdicts)
    lines.append(f"{len(verdicts)} tasks, {broken} broken")
    return lines
