"""Running one harness episode: the process, its limits, its outcome, its record.

`run_harness_episode` opens the episode's `HarnessSession` on the worker's gateway, makes a
fresh working directory, starts the harness in a process group of its own with an
environment built from the allow-list (`collector.harness.env`), and waits for the first of:
the harness exits; the gateway ends the episode (a stop rule fired, the provider failed);
the wall-clock limit. Then the whole process group is stopped however the episode went:
SIGTERM, and SIGKILL after `grace_s` for whatever is left, so no child the harness forked
outlives its episode (one that left the group with `setsid` is out of reach). The group's
leader is a small supervisor (`collector/harness/reaper.py`) that runs the harness and stops
the group itself when the worker dies, SIGKILL included.

Outcome, in this order:
- the gateway ended the episode: its stop reason (`length`, `malformed_tool_call`,
  `context_overflow`, `max_steps`, or `error` when the provider failed);
- the limit expired: `timeout`;
- the harness exited with a status other than 0 (and, under `reward = "exit_status"`,
  other than `failure_exit_status`), or was killed by a signal: `error`, its message naming
  the harness, the status and the tail of its stderr (redacted like every stored text);
- it exited without ever calling the model: `error`;
- else `done`, rewarded by `reward` (exit status, reward file, grader).

Cut and malformed episodes get reward 0.0, as in the loop's "zero" policy; `timeout` and
`error` are not trainable (`record_episode`).

Tests: tests/harness/test_harness_env.py, tests/system/harness/test_harness_run.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from collector.config import LoopConfig
from collector.episode.loop import EpisodeSpec, record_episode
from collector.errors import ConfigError
from collector.harness.env import BASE_ENV, HarnessEnv, HarnessSettings, task_text
from collector.harness.gateway import Gateway, episode_root
from collector.harness.reaper import live_members
from collector.harness.session import HarnessSession
from collector.providers.base import Provider
from collector.record.episode import Episode, EpisodeError
from collector.stop import StopReason

__all__ = ["harness_argv", "harness_environment", "run_harness_episode"]

_REAPER = Path(__file__).with_name("reaper.py")
_STDERR_TAIL = 800
"""Characters of the harness's stderr kept in an `error` episode's message."""


class HarnessFailed(Exception):
    """The harness crashed, or its reward could not be read: an `error` episode."""


def harness_argv(settings: HarnessSettings, spec: EpisodeSpec, workdir: Path, root: str) -> list[str]:
    """The command line with its templates filled (a field it names that does not exist fails)."""
    fields: dict[str, Any] = {
        "task": task_text(spec.task), "task_id": spec.task.id, "workdir": str(workdir),
        "base_url": root + "/v1", "anthropic_base_url": root, "model": spec.model, "budget": spec.budget,
        "metadata": dict(spec.task.metadata), "python": sys.executable,
    }
    try:
        return [arg.format_map(fields) for arg in settings.command]
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        raise HarnessFailed(f"{settings.label}: env.options.command: cannot fill {exc!s:.80} "
                            f"for task {spec.task.id}") from None


def harness_environment(settings: HarnessSettings, token: str, root: str, workdir: Path, task_id: str,
                        credentials: tuple[str, ...], python_path: tuple[str, ...] = ()) -> dict[str, str]:
    """The harness's variables: the allow-list, never a value that is one of the run's credentials."""
    secret = set(credentials)
    out = {k: os.environ[k] for k in (*BASE_ENV, *settings.pass_env) if k in os.environ}
    out.update(settings.env)
    out = {k: v for k, v in out.items() if v not in secret}
    if python_path:
        out["PYTHONPATH"] = os.pathsep.join([*python_path, *filter(None, [out.get("PYTHONPATH")])])
    out.update({
        "OPENAI_BASE_URL": root + "/v1", "OPENAI_API_KEY": token,
        "ANTHROPIC_BASE_URL": root, "ANTHROPIC_API_KEY": token,
        "COLLECTOR_WORKDIR": str(workdir), "COLLECTOR_TASK_ID": task_id,
    })
    return out


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs. Zombies do not count: the supervisor's own
    SIGKILL (reaper.py) orphans the harness it has not reaped, and the orphan waits for init,
    which may reap it late or, as PID 1 of a container without an init, never; counted, each
    stopped harness would cost its episode the whole `grace_s`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member that changed its user: still there
        return True
    try:
        return live_members(pgid) > 0
    except OSError:  # no /proc: the signal's answer is all there is
        return True


async def stop_group(process: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM to the harness's process group, SIGKILL after `grace_s` to whatever is left."""
    pgid = process.pid  # start_new_session: the harness leads its own group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if process.returncode is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(process.wait()), 0.05)
        elif not _group_alive(pgid):
            break
        else:
            await asyncio.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    await process.wait()


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - _STDERR_TAIL))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return " ".join(text.split())[-_STDERR_TAIL:]


async def _reward(settings: HarnessSettings, spec: EpisodeSpec, workdir: Path, final_text: str | None,
                  status: int, loop: LoopConfig) -> float:
    if settings.reward == "exit_status":
        return 1.0 if status == 0 else 0.0
    if settings.reward == "reward_file":
        path = workdir / settings.reward_file
        try:
            value = float(path.read_text().strip())
        except (OSError, ValueError) as exc:
            raise HarnessFailed(f"{settings.label}: reward file {settings.reward_file}: "
                                f"{type(exc).__name__}") from None
    else:
        assert settings.grader is not None
        module_name, _, attr = settings.grader.partition(":")
        try:
            grader = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"env.options.grader: cannot load {settings.grader!r} "
                              f"({type(exc).__name__})") from None
        try:
            async with asyncio.timeout(loop.tool_timeout_s):
                value = float(await asyncio.to_thread(grader, workdir=workdir, final_text=final_text,
                                                      task=spec.task))
        except Exception as exc:  # noqa: BLE001 - a grader crash is this episode's error, in one line
            raise HarnessFailed(f"{settings.label}: grader {settings.grader}: {type(exc).__name__}") from None
    if not math.isfinite(value):
        raise HarnessFailed(f"{settings.label}: the reward is not a finite number")
    return value


async def run_harness_episode(spec: EpisodeSpec, provider: Provider, env: HarnessEnv, loop: LoopConfig,
                              gateway: Gateway, server_root: str) -> Episode:
    """Run one harness episode to its end and return its record (see the module docstring).

    `server_root` is the gateway server's; the harness is given the episode's own root under it."""
    started = time.perf_counter()
    settings = env.settings
    session = HarnessSession(spec, provider, loop, enforce=settings.enforce_stop_rules,
                             harness=settings.label)
    gateway.open(session)
    root = episode_root(server_root, session)
    base = Path(tempfile.mkdtemp(prefix=f"harness-{spec.episode_id[:12]}-", dir=settings.workdir_root))
    workdir = base / "work"
    workdir.mkdir()
    reason: StopReason | None = None
    error: EpisodeError | None = None
    reward = 0.0
    try:
        try:
            argv = harness_argv(settings, spec, workdir, root)
            variables = harness_environment(settings, session.token, root, workdir, spec.task.id,
                                            spec.credentials, env.python_path)
            with (base / "stdout").open("wb") as out, (base / "stderr").open("wb") as err:
                try:
                    # Under the supervisor that stops the group if the worker dies (reaper.py).
                    supervised = [sys.executable, str(_REAPER), str(settings.grace_s), str(os.getpid()), "--",
                                  *argv]
                    process = await asyncio.create_subprocess_exec(
                        *supervised, cwd=workdir, env=variables, stdin=asyncio.subprocess.DEVNULL, stdout=out,
                        stderr=err, start_new_session=True)
                except OSError as exc:
                    why = exc.strerror or type(exc).__name__
                    raise HarnessFailed(f"{settings.label}: cannot start: {why}") from None
            status, timed_out = await _wait(process, session, settings.timeout_s or loop.episode_timeout_s,
                                            settings.grace_s)
            reason = session.reason or session.would_end
            if reason is None and timed_out:
                reason = StopReason.TIMEOUT
            if reason is None:
                failed_ok = settings.reward == "exit_status" and status == settings.failure_exit_status
                if status != 0 and not failed_ok:
                    how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
                    tail = _tail(base / "stderr")
                    raise HarnessFailed(f"{settings.label} {how}" + (f"; stderr: {tail}" if tail else ""))
                if not session.state.turns:
                    raise HarnessFailed(f"{settings.label} exited without calling the model")
                reward = await _reward(settings, spec, workdir, session.final_text, status, loop)
                reason = StopReason.DONE
            error = session.error
        except HarnessFailed as exc:
            reason, reward = StopReason.ERROR, 0.0
            error = EpisodeError("HarnessFailed", session.state.redactor.redact_text(str(exc))[:1200])
    finally:
        session.end(reason or StopReason.ERROR)
        gateway.close(session)
        session.finish()
        if not settings.keep_workdir:
            shutil.rmtree(base, ignore_errors=True)
    done = reason is StopReason.DONE
    rewards = (reward, reward) if done else (0.0, None)
    return record_episode(spec, env.name, session.state, reason or StopReason.ERROR, rewards, error,
                          session.offered, time.perf_counter() - started)


async def _wait(process: asyncio.subprocess.Process, session: HarnessSession, limit_s: float,
                grace_s: float) -> tuple[int, bool]:
    """(exit status, whether the limit expired); the process group is stopped either way."""
    exited = asyncio.ensure_future(process.wait())
    ended = asyncio.ensure_future(session.ended.wait())
    try:
        done, _ = await asyncio.wait({exited, ended}, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ended.cancel()
        await stop_group(process, grace_s)  # also on cancellation: no harness outlives its episode
    status = process.returncode
    assert status is not None
    return status, not done
