"""The command line as a process: `python -m collector`, a closed stdout, a quiet local start,
and SIGTERM / Ctrl-C on a running sweep (committed work kept, one line, resumable).

Every test here runs `python -m collector` in a subprocess, with Ray's and the test
session's variables (RAY_ADDRESS, RAY_AUTH_MODE) removed, so what is seen is what a user
sees. Signals are sent once the run has committed a shard: proof that episodes are in flight
(the sweep is sized so that it is far from done at its first commit, and the test checks
that it was).

Only the signal storms need Ray (its shutdown used to reset SIGTERM's action, and impatient
Ctrl-Cs land in it): the single SIGTERM runs its workers in process (`--in-process`; the
signal, the exit code and the line are the CLI's, not Ray's), and what follows every signal,
`collector check` and the rerun that resumes the run dir, runs in this process (`main`): its
subject is the run dir, which is the same whichever pool wrote it. That saves a Ray start
(about 13 s) per process that is not about Ray.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collector import __version__
from collector.cli import main
from tests.checking import committed_ids
from tests.system.processes import SLOW, WAIT_GUARD_S, start_and_wait_for_a_commit, user_env

QUIET = """
name = "quiet"
[sweep]
models = ["sim-terse"]
budgets = [64]
[env]
name = "arithmetic"
tasks = 4
[ray]
workers = 1
cpus_per_worker = 0.5
[output]
path = "{run_dir}"
"""

def collector(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "collector", *args], env=user_env(), text=True, capture_output=True,
        timeout=WAIT_GUARD_S, **kwargs
    )


def test_python_m_collector_prints_the_version() -> None:
    """`python -m collector --version` works like the `collector` script."""
    done = collector("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"collector {__version__}"


def test_closed_stdout_ends_quietly(tmp_path: Path) -> None:
    """`collector stats RUN | head`: a reader that went away ends the command with 141 and no message."""
    from collector.storage.local import LocalRunStore
    from tests.record.factory import make_batch

    run = tmp_path / "run"
    with LocalRunStore.open(run, "fp", {}, "arrow", 8) as store:
        store.commit(make_batch(40, model="m1", budget=64))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte: every write fails
    try:
        done = subprocess.run(
            [sys.executable, "-m", "collector", "stats", str(run), "--by", "model,budget,task_id"],
            env=user_env(), stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=WAIT_GUARD_S,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""


def test_local_run_starts_quietly(tmp_path: Path) -> None:
    """A `--quiet` run on the embedded cluster prints only its summary on stderr (no Ray token notice)."""
    config = tmp_path / "quiet.toml"
    config.write_text(QUIET.format(run_dir=tmp_path / "run"))
    done = collector("run", str(config), "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [f"{tmp_path / 'run'}: 4/4 episodes committed; 4 new in "
                                        + done.stderr.split(" new in ", 1)[1].strip()]
    assert "Token authentication" not in done.stderr


@pytest.fixture
def slow_run(tmp_path: Path) -> tuple[Path, Path]:
    """The config of a sweep that runs for a while, and its run directory."""
    config = tmp_path / "slow.toml"
    run_dir = tmp_path / "run"
    config.write_text(SLOW.format(run_dir=run_dir))
    return config, run_dir


PLANNED = 300


def assert_interrupted_then_resumed(process: subprocess.Popen[str], run_dir: Path, config: Path,
                                    code: int, name: str) -> None:
    """Exit `code`, one collector line naming the signal, a clean run dir; the rerun adds exactly the rest."""
    _, err = process.communicate(timeout=WAIT_GUARD_S)
    assert process.returncode == code, err
    assert "Traceback" not in err
    assert err.splitlines() == [f"collector: interrupted ({name}); run the same command again to resume"], err
    before = committed_ids(run_dir)
    assert 0 < len(before) < PLANNED, "the signal did not land mid-run"
    assert set(before.values()) == {1}

    check_out = io.StringIO()
    with contextlib.redirect_stdout(check_out), contextlib.redirect_stderr(check_out):
        assert main(["check", str(run_dir)]) == 0, check_out.getvalue()

    # The rerun in process, with more episodes in flight: the Ray layout and concurrency are
    # not part of the run's identity (collector.config.identity), so this is the same run.
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(["run", str(config), "--quiet", "--in-process",
                     "--set", "ray.episodes_in_flight=32"]) == 0, err.getvalue()
    old, new = len(before), PLANNED - len(before)
    assert f"{PLANNED}/{PLANNED} episodes committed; {old} from earlier runs; {new} new" in err.getvalue()
    after = committed_ids(run_dir)
    assert len(after) == PLANNED
    assert set(after.values()) == {1}
    assert set(before) <= set(after)


@pytest.mark.timeout(600)
def test_sigterm_commits_what_finished_and_exits_143(slow_run: tuple[Path, Path]) -> None:
    """SIGTERM mid-run acts as Ctrl-C: committed work kept, one line, exit 143; the rerun completes.
    Workers in process: the storm below covers the same on Ray."""
    config, run_dir = slow_run
    process = start_and_wait_for_a_commit(config, run_dir, "--in-process")
    process.send_signal(signal.SIGTERM)
    assert_interrupted_then_resumed(process, run_dir, config, 143, "SIGTERM")


@pytest.mark.timeout(600)
def test_repeated_ctrl_c_keeps_exit_130(slow_run: tuple[Path, Path]) -> None:
    """Ctrl-C, then Ctrl-C again until the process is gone: still exit 130, one line, a resumable run dir."""
    config, run_dir = slow_run
    process = start_and_wait_for_a_commit(config, run_dir)
    process.send_signal(signal.SIGINT)
    # Impatient presses land in every phase of the shutdown: final commit, Ray's, the exit.
    while process.poll() is None:
        process.send_signal(signal.SIGINT)
        time.sleep(0.05)
    assert_interrupted_then_resumed(process, run_dir, config, 130, "SIGINT")


@pytest.mark.timeout(600)
def test_repeated_sigterm_keeps_exit_143(slow_run: tuple[Path, Path]) -> None:
    """SIGTERM, then SIGTERM every 100 ms until the process is gone: still exit 143, one line, a
    resumable run dir. The storm covers Ray's shutdown, which used to reset SIGTERM's action to
    the default part way through (the driver then died with -15 and no line)."""
    config, run_dir = slow_run
    process = start_and_wait_for_a_commit(config, run_dir)
    process.send_signal(signal.SIGTERM)
    while process.poll() is None:
        process.send_signal(signal.SIGTERM)
        time.sleep(0.1)
    assert_interrupted_then_resumed(process, run_dir, config, 143, "SIGTERM")
