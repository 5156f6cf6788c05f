"""`collector follow` as a process: the CLI's two output formats, and followers SIGKILLed during a live
run (local and in a bucket) resuming from their last cursor. The follower's logic in process:
tests/analysis/test_follow.py.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from collector.analysis.follow import follow
from tests.analysis.test_follow import GUARD_S, cli, committed_in_order, episodes, open_store, rows
from tests.checking import assert_run_checked
from tests.s3server import S3Bucket
from tests.system.processes import user_env


def test_the_cli_writes_jsonl_lines_and_an_arrow_stream_with_the_same_cursors(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with open_store(run, samples=2) as store:
        store.commit(episodes(range(3), sample=0) + episodes(range(2), sample=1, errors=frozenset({"t1"})))
        store.commit(episodes(range(3, 4), sample=1))
    done = cli(str(run))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [line["episode"]["episode_id"] for line in lines] == committed_in_order(run)
    assert [line["cursor"] for line in lines] == [c for c, _ in rows(follow(run, poll_s=0))]
    stream = cli(str(run), "--format", "arrow")
    assert stream.returncode == 0, stream.stderr
    table = pa.ipc.open_stream(stream.stdout).read_all()
    assert table.column("cursor").to_pylist() == [line["cursor"] for line in lines]
    assert table.column("episode_id").to_pylist() == committed_in_order(run)
    grouped = cli(str(run), "--groups", "complete")
    assert grouped.returncode == 0, grouped.stderr
    released = [json.loads(line) for line in grouped.stdout.decode().splitlines()]
    assert [(r["episode"]["task_id"], r["episode"]["sample"], r["group_errors"]) for r in released] == [
        ("t0", 0, 0), ("t0", 1, 0), ("t1", 0, 1), ("t1", 1, 1)]  # one commit's two groups, one error
    held = grouped.stderr.decode().splitlines()
    assert len(held) == 1
    assert held[0].startswith(f"collector follow: {run}: 2 incomplete group(s) held (2 samples)")
    resumed = cli(str(run), "--groups", "complete", "--since", held[0].rsplit("--since ", 1)[1].split()[0])
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == b""
    empty = tmp_path / "empty"
    open_store(empty).close()
    nothing = cli(str(empty), "--format", "arrow")
    assert nothing.returncode == 0, nothing.stderr
    assert pa.ipc.open_stream(nothing.stdout).read_all().num_rows == 0
    bad = cli(str(run), "--since", "nonsense")
    assert bad.returncode == 2
    assert bad.stderr.decode().splitlines() == [
        f"collector: error: {run}: 'nonsense' is not a follow cursor (STORE:SEQ.N.LAST[+K:SHARD:ROW], as "
        "`collector follow` prints it; a cursor from before store ids: follow from the start)"]


# --- processes: collector run + a SIGKILLed collector follow ---------------------------------

SWEEP = """
name = "followed"
samples_per_task = {samples}
[sweep]
models = ["sim-slow"]
budgets = [64, 128]
[env]
name = "arithmetic"
tasks = {tasks}
[ray]
workers = 1
episodes_in_flight = 4
batch_size = 4
cpus_per_worker = 0.5
[output]
path = "{run_dir}"
rows_per_shard = 3
commit_interval_s = 0.3
"""


def follow_until(run: str, since: str | None, kill_after: int | None, env: dict[str, str],
                 *extra: str) -> tuple[list[dict[str, object]], int]:
    """Run `collector follow` and read its lines; SIGKILL it once it printed `kill_after` lines
    (an event: the lines read), or let it end. The lines read, and the exit code."""
    argv = [sys.executable, "-m", "collector", "follow", run, "--poll", "0.2", *extra]
    if since is not None:
        argv += ["--since", since]
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        lines: list[dict[str, object]] = []
        try:
            for raw in proc.stdout:
                lines.append(json.loads(raw))
                if kill_after is not None and len(lines) >= kill_after:
                    proc.send_signal(signal.SIGKILL)
                    break
            code = proc.wait(timeout=GUARD_S)
        finally:
            if proc.poll() is None:
                proc.kill()
        errors = proc.stderr.read()
    assert code in (0, -signal.SIGKILL), errors
    assert code != 0 or errors == "", errors
    return lines, code


def followed_with_kills(run: str, env: dict[str, str], kills: int, seed: int, writer: subprocess.Popen[str],
                        *extra: str) -> tuple[list[dict[str, object]], int, int]:
    """Follow `run` to its end, SIGKILLed `kills` times after a random number of lines and
    restarted from the last cursor printed. Every line printed, how many kills happened, and
    how many of them while `writer` was still collecting."""
    rng = random.Random(seed)
    got: list[dict[str, object]] = []
    since: str | None = None
    killed = live = 0
    while True:
        kill_after = rng.randint(1, 9) if killed < kills else None
        lines, code = follow_until(run, since, kill_after, env, *extra)
        got.extend(lines)
        if lines:
            since = str(lines[-1]["cursor"])
        if code == 0:
            return got, killed, live
        killed += 1
        live += writer.poll() is None


def uninterrupted_follower(run: str, env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    """A `collector follow` from the start, never killed, with a separate mirror cache: started
    once the run has committed, it must not end before the run's writer is gone."""
    cache = {}
    if run.startswith("s3://"):
        cache["COLLECTOR_CACHE_DIR"] = env["COLLECTOR_CACHE_DIR"] + "-whole"
    return subprocess.Popen([sys.executable, "-m", "collector", "follow", run, "--poll", "0.2", *extra],
                            env={**env, **cache}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_to_the_end(proc: subprocess.Popen[str]) -> list[dict[str, object]]:
    out, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in out.splitlines()]


def start_run(tmp_path: Path, run_dir: str, env: dict[str, str], samples: int,
              tasks: int) -> subprocess.Popen[str]:
    config = tmp_path / "sweep.toml"
    config.write_text(SWEEP.format(run_dir=run_dir, samples=samples, tasks=tasks))
    # Workers in process: the follower is the subject, the writer only has to be a live run in
    # another process (a Ray start would add about 13 s and nothing the follower sees).
    argv = [sys.executable, "-m", "collector", "run", str(config), "--quiet", "--in-process"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)


def wait_for_first_commit(run: Path, writer: subprocess.Popen[str]) -> None:
    """Until the run's first commit record exists (the follower then starts on a live run)."""
    import time

    deadline = time.monotonic() + GUARD_S
    while not list((run / ".collector").glob("commit-*.json")):
        assert writer.poll() is None, writer.stderr.read() if writer.stderr else writer.returncode
        assert time.monotonic() < deadline, "collector run committed nothing"
        time.sleep(0.05)


def assert_exactly_once_in_commit_order(lines: list[dict[str, object]], run: Path,
                                        grouped: bool = False) -> None:
    ids = [str(line["episode"]["episode_id"]) for line in lines]  # type: ignore[index]
    assert len(ids) == len(set(ids)), "an episode was delivered twice"
    committed = committed_in_order(run)
    assert sorted(ids) == sorted(committed), "not every committed episode was delivered"
    seqs = [int(line["seq"]) for line in lines]  # type: ignore[call-overload]
    assert seqs == sorted(seqs), "not in commit order"
    if not grouped:  # no forget here: the base lists every shard in commit order, rows in file order
        assert ids == committed, "not in commit order"
    assert_run_checked(run)


@pytest.mark.parametrize("grouped", [False, True], ids=["all", "complete"])
def test_a_sigkilled_follower_resumed_from_its_last_cursor_gets_every_episode_once(
        tmp_path: Path, grouped: bool) -> None:
    run = tmp_path / "run"
    env = user_env()
    samples = 2 if grouped else 1
    # 30 tasks: the run outlasts the kills, which land within a few lines each (4 of 4 live, quiet
    # or at a load of 4 on two cores); the test waits for the run's end, so it costs its length.
    with start_run(tmp_path, str(run), env, samples, tasks=30) as writer:
        assert writer.stderr is not None
        try:
            wait_for_first_commit(run, writer)
            extra = ("--groups", "complete") if grouped else ()
            with uninterrupted_follower(str(run), env, *extra) as whole:
                lines, killed, live = followed_with_kills(str(run), env, 4, 27 + grouped, writer, *extra)
                code = writer.wait(timeout=GUARD_S)
                unkilled = read_to_the_end(whole)
        finally:
            if writer.poll() is None:
                writer.kill()
        assert code == 0, writer.stderr.read()
    assert killed == 4
    assert live >= 1, "every kill came after the run had ended: make the sweep longer"
    assert_exactly_once_in_commit_order(lines, run, grouped)
    # one follower started with the run and never killed: it ended only after the run did
    assert [line["episode"] for line in unkilled] == [line["episode"] for line in lines]
    if grouped:
        groups: dict[tuple[object, ...], list[object]] = {}
        for line in lines:
            ep = line["episode"]
            assert isinstance(ep, dict)
            groups.setdefault((ep["task_id"], ep["model"], ep["budget"]), []).append(ep["sample"])
        assert all(sorted(s) == [0, 1] for s in groups.values()), "a partial group was released"
        # released whole: a group's two lines are adjacent
        keys = [(line["episode"]["task_id"], line["episode"]["budget"]) for line in lines]  # type: ignore[index]
        assert all(keys[i] == keys[i + 1] for i in range(0, len(keys), 2))


def test_a_sigkilled_follower_of_a_run_in_s3_resumed_from_its_last_cursor_gets_every_episode_once(
        tmp_path: Path, s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same against a run in a bucket (moto on loopback), followed through the mirror's sync."""
    from collector.storage.mirror import resolve_run

    uri = s3_bucket.uri()
    env = {**user_env(), **s3_bucket.env(), "COLLECTOR_CACHE_DIR": str(tmp_path / "follower-cache")}
    with start_run(tmp_path, uri, env, 1, tasks=24) as writer:
        assert writer.stderr is not None
        try:
            import time

            deadline = time.monotonic() + GUARD_S
            while not [k for k in s3_bucket.keys("run/.collector/") if "/commit-" in k]:
                assert writer.poll() is None, writer.stderr.read()
                assert time.monotonic() < deadline, "collector run committed nothing"
                time.sleep(0.05)
            with uninterrupted_follower(uri, env) as whole:
                lines, killed, live = followed_with_kills(uri, env, 3, 2027, writer, "--groups", "all")
                code = writer.wait(timeout=GUARD_S)
                unkilled = read_to_the_end(whole)
        finally:
            if writer.poll() is None:
                writer.kill()
        assert code == 0, writer.stderr.read()
    assert killed == 3
    assert live >= 1, "every kill came after the run had ended: make the sweep longer"
    monkeypatch.setenv("COLLECTOR_CACHE_DIR", str(tmp_path / "check-cache"))
    assert_exactly_once_in_commit_order(lines, resolve_run(uri))
    assert [line["episode"] for line in unkilled] == [line["episode"] for line in lines]
