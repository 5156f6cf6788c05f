"""`collector regrade` (collector.analysis.regrade): a changed grader, exactly once under SIGKILL."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from collector.analysis.regrade import read_annotation, regrade_run
from collector.cli import main
from collector.envs.arithmetic import ArithmeticEnv, ArithmeticWorld
from collector.envs.base import EpisodeContext, Task
from collector.errors import ConfigError, OutputError
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from tests.analysis.test_health import sim_sweep
from tests.record.factory import make_batch

S = StopReason
SPEC = "tests.analysis.test_regrade:StrictArithmetic"
_graded = 0


class StrictWorld(ArithmeticWorld):
    def grade(self, final_text: str | None) -> float:
        # The changed grader: half credit, and only when the replayed calculator really ran
        # (so a regrade that skips the tools, or calls the model, is caught).
        global _graded
        _graded += 1
        kill_at = int(os.environ.get("REGRADE_KILL_AT", "0"))
        if kill_at and _graded == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # the fault: on the kill_at-th grade, not a timer
        return 0.5 if self.calls and super().grade(final_text) == 1.0 else 0.0


class StrictArithmetic(ArithmeticEnv):
    """The factory's tasks t0..t39 (37 * 12 + 5), regradable, with the stricter grader."""

    name = "arithmetic"
    regradable = True
    grader_version = "strict-2"

    def tasks(self) -> Sequence[Task]:
        return [Task(f"t{i}", "What is 37 * 12 + 5?", {"expression": "37 * 12 + 5"}) for i in range(40)]

    def start(self, task: Task, context: EpisodeContext | None = None) -> StrictWorld:
        return StrictWorld(449)


STOPS = (S.DONE, S.DONE, S.LENGTH, S.MALFORMED_TOOL_CALL, S.ERROR)


def make_run(root: Path) -> Path:
    run = root / "run"
    with LocalRunStore.open(run, "fp", {"samples_per_task": 1}, "arrow", 8) as st:
        st.commit(make_batch(40, model="m1", budget=64, stops=STOPS))
    return run


def test_regrade_exactly_once_under_sigkill(tmp_path: Path) -> None:
    """Killed at random grades (three times), then run to the end: every episode once."""
    run = make_run(tmp_path)
    rng = random.Random(30)
    code = ("import sys; from collector.analysis.regrade import regrade_run; "
            "from tests.analysis.test_regrade import StrictArithmetic; "
            f"regrade_run(sys.argv[1], StrictArithmetic(), {SPEC!r}, 'strict', batch=3)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    kills = 0
    for _ in range(3):
        # 16 gradeable (done) episodes in all; each run kills before it reaches the end.
        left = 16 - len([r for r in _rows(run) if r["graded"]]) if _has(run) else 16
        if left <= 1:
            break
        proc = subprocess.run([sys.executable, "-c", code, str(run)], env={**env, "REGRADE_KILL_AT":
                              str(rng.randint(1, left - 1))}, capture_output=True, check=False)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
        kills += 1
    assert kills >= 2
    # And once in the narrowest window: the chunk renamed into place, its record not yet made
    # (killed on the event of its first record's creation), which leaves an orphan chunk.
    window = ("import os, signal, sys\n"
              "from collector.analysis.annotation_store import LocalAnnotations as L\n"
              "real = L.create; n = [0]\n"
              "def gate(self, name, data):\n"
              "    n[0] += name.startswith('commit-')\n"
              "    if n[0] == 1: os.kill(os.getpid(), signal.SIGKILL)\n"
              "    return real(self, name, data)\n"
              "L.create = gate\n" + code)
    proc = subprocess.run([sys.executable, "-c", window, str(run)], env=env, capture_output=True, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    folder = run / ".collector" / "annotations" / "strict"
    named = {json.loads(p.read_text())["chunk"] for p in folder.glob("commit-*.json")}
    assert {p.name for p in folder.glob("chunk-*")} - named  # the orphan is there before the rerun
    proc = subprocess.run([sys.executable, "-c", code, str(run)], env=env, capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    ids = [r["episode_id"] for r in _rows(run)]
    assert len(ids) == len(set(ids)) == 40
    folder = run / ".collector" / "annotations" / "strict"
    assert not list(folder.glob("*.tmp"))
    named = {json.loads(p.read_text())["chunk"] for p in folder.glob("commit-*.json")}
    assert {p.name for p in folder.glob("chunk-*")} == named  # orphans of the kills were removed


def _has(run: Path) -> bool:
    return (run / ".collector" / "annotations" / "strict" / "meta.json").is_file()


def _rows(run: Path) -> list[dict[str, object]]:
    return read_annotation(run, "strict").to_pylist()


def test_stats_annotation_shows_new_rewards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path)
    result = regrade_run(run, StrictArithmetic(), SPEC, "strict")
    assert (result.annotated, result.total) == (40, 40)
    by_reason: dict[str, set[float]] = {}
    stops = {e.episode_id: e.stop_reason.value for e in make_batch(40, model="m1", budget=64, stops=STOPS)}
    for r in _rows(run):
        by_reason.setdefault(stops[str(r["episode_id"])], set()).add(float(r["reward"]))  # type: ignore[arg-type]
    assert by_reason == {"done": {0.5}, "length": {0.0}, "malformed_tool_call": {0.0}, "error": {0.0}}
    assert regrade_run(run, StrictArithmetic(), SPEC, "strict").annotated == 0  # nothing left to do
    assert main(["stats", str(run), "--annotation", "strict", "--format", "json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    # 16 done at 0.5, 8 cut and 8 malformed at 0, over the 32 episodes that did not end in error.
    assert row["mean_reward"] == pytest.approx(16 * 0.5 / 32)
    assert main(["stats", str(run), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["mean_reward"] == pytest.approx(16 / 32)
    assert main(["stats", str(run), "--groups", "--annotation", "strict", "--format", "json"]) == 0
    capsys.readouterr()
    assert main(["stats", str(run), "--annotation", "strict", "--by", "stop_reason", "--format", "json"]) == 0
    per_reason = {r["stop_reason"]: r["mean_reward"] for r in json.loads(capsys.readouterr().out)["rows"]}
    assert per_reason["done"] == 0.5
    assert per_reason["length"] == per_reason["malformed_tool_call"] == 0.0


def test_export_takes_the_annotation_rewards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`export --annotation`: parquet's reward column and ATIF's extra.reward are the regrade's,
    a `--where reward...` tests that reward, and a partial annotation is refused with nothing written."""
    import pyarrow.parquet as pq

    from collector.analysis.atif import read_atif

    run = make_run(tmp_path)
    regrade_run(run, StrictArithmetic(), SPEC, "strict")
    out = tmp_path / "regraded.parquet"
    assert main(["export", str(run), str(out), "--format", "parquet", "--annotation", "strict"]) == 0
    table = pq.read_table(out, columns=["episode_id", "stop_reason", "reward"]).to_pylist()
    assert len(table) == 40
    assert {(r["stop_reason"], r["reward"]) for r in table} == {
        ("done", 0.5), ("length", 0.0), ("malformed_tool_call", 0.0), ("error", 0.0)}
    # The filter sees the annotation's reward (stored: 1.0 for done), not the stored one.
    assert main(["export", str(run), str(out), "--format", "parquet", "--annotation", "strict",
                 "--where", "reward>=0.5"]) == 0
    assert pq.read_table(out).num_rows == 16
    assert main(["export", str(run), str(out), "--format", "parquet", "--where", "reward>=0.5"]) == 0
    assert set(pq.read_table(out).column("reward").to_pylist()) == {1.0}
    atif = tmp_path / "regraded.atif.jsonl"
    assert main(["export", str(run), str(atif), "--format", "atif", "--annotation", "strict",
                 "--where", "stop_reason=done"]) == 0
    trajectories = read_atif(atif)
    assert len(trajectories) == 16
    assert {(t["extra"]["reward"], t["extra"]["reward_annotation"]) for t in trajectories} == {
        (0.5, "strict")}
    capsys.readouterr()
    assert main(["export", str(run), str(tmp_path / "x.jsonl"), "--annotation", "strict"]) == 2
    assert "chat-jsonl carries no reward" in capsys.readouterr().err
    with LocalRunStore.open(run, "fp", {"samples_per_task": 1}, "arrow", 8) as st:
        st.commit(make_batch(2, model="m2", budget=64, stops=STOPS))  # committed after the regrade
    late = tmp_path / "late.parquet"
    assert main(["export", str(run), str(late), "--format", "parquet", "--annotation", "strict"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "lacks 2 of 42" in err
    assert not late.exists()


def test_trainer_view_takes_the_annotation_rewards(tmp_path: Path) -> None:
    """`trainer-view --annotation`: every row carries the regrade's reward; cut episodes keep 0."""
    import asyncio

    import httpx
    import pyarrow.parquet as pq

    from collector.config import LoopConfig
    from collector.episode.loop import EpisodeSpec, run_episode
    from collector.providers import Endpoint, base_url_for, build_provider
    from collector.sim.app import create_app
    from collector.turn import SamplingParams

    env = ArithmeticEnv(num_tasks=4)  # collected with the stored grader, regraded with HalfArithmetic

    async def episodes() -> list[object]:
        out = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(seed=0))) as client:
            provider = build_provider("chat", Endpoint(base_url_for("chat", "http://sim.test"), api_key="k"),
                                      client)
            for budget in (8, 256):
                for task in env.tasks():
                    spec = EpisodeSpec("tv", "sim-terse", "chat", budget, task, seed=0, env_name=env.name,
                                       sampling=SamplingParams(token_ids=True))
                    out.append(await run_episode(spec, provider, env, LoopConfig()))
        return out

    run = tmp_path / "run"
    with LocalRunStore.open(run, "fp", {"samples_per_task": 1}, "parquet", 8) as st:
        st.commit(asyncio.run(episodes()))  # type: ignore[arg-type]
    regrade_run(run, HalfArithmetic(num_tasks=4), "tests.analysis.test_regrade:HalfArithmetic", "half")
    plain, half = tmp_path / "plain.parquet", tmp_path / "half.parquet"
    assert main(["trainer-view", str(run), str(plain)]) == 0
    assert main(["trainer-view", str(run), str(half), "--annotation", "half"]) == 0
    rows = {r["episode_id"]: r for r in pq.read_table(plain).to_pylist()}
    halves = {r["episode_id"]: r for r in pq.read_table(half).to_pylist()}
    assert rows.keys() == halves.keys()
    assert {r["stop_reason"] for r in rows.values()} >= {"done", "length"}
    for eid, row in rows.items():
        expected = 0.0 if row["stop_reason"] == "length" else 0.5 * row["reward"]
        assert halves[eid]["reward"] == expected, (row["stop_reason"], row["reward"])
        assert halves[eid]["input_ids"] == row["input_ids"]
    assert any(r["reward"] == 0.5 for r in halves.values())


def test_follow_takes_the_annotation_rewards(tmp_path: Path) -> None:
    """`follow(..., annotation=NAME)`: every delivered episode carries the regrade's reward; an
    episode committed after the regrade is an error naming the gap, never the stored reward."""
    from collector.analysis.follow import follow

    run = make_run(tmp_path)
    regrade_run(run, StrictArithmetic(), SPEC, "strict")
    stops = {e.episode_id: e.stop_reason.value for e in make_batch(40, model="m1", budget=64, stops=STOPS)}
    got = {}
    for batch in follow(run, annotation="strict"):
        got.update(zip(batch.table.column("episode_id").to_pylist(), batch.table.column("reward").to_pylist(),
                       strict=True))
    assert len(got) == 40
    assert {(stops[e], r) for e, r in got.items()} == {
        ("done", 0.5), ("length", 0.0), ("malformed_tool_call", 0.0), ("error", 0.0)}
    with LocalRunStore.open(run, "fp", {"samples_per_task": 1}, "arrow", 8) as st:
        st.commit(make_batch(2, model="m2", budget=64, stops=STOPS))
    with pytest.raises(OutputError, match="lacks 2 of 2"):
        list(follow(run, annotation="strict"))


def test_regrade_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path)
    assert main(["regrade", str(run), "--env", "arithmetic"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "does not declare itself regradable" in err
    regrade_run(run, StrictArithmetic(), SPEC, "strict", batch=5)
    other = StrictArithmetic()
    other.grader_version = "strict-3"
    with pytest.raises(ConfigError, match="was begun with grader arithmetic strict-2"):
        regrade_run(run, other, SPEC, "strict")
    assert main(["stats", str(run), "--annotation", "nope"]) == 2


class HalfArithmetic(ArithmeticEnv):
    """The built-in arithmetic tasks with a changed grader: half credit for a right answer."""

    regradable = True
    grader_version = "half-1"

    def start(self, task: Task, context: EpisodeContext | None = None) -> ArithmeticWorld:
        world = super().start(task, context)
        plain = world.grade
        world.grade = lambda final_text: 0.5 * plain(final_text)  # type: ignore[method-assign]
        return world


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sim_sweep(tmp_path_factory.mktemp("sim") / "run")


def test_regrade_a_simulator_run(sim_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regraded through the CLI; `stats --annotation` halves every cell's mean reward, and the
    all-cut budget stays at 0 whatever the grader says."""
    spec = "tests.analysis.test_regrade:HalfArithmetic"
    assert main(["regrade", str(sim_run), "--env", spec, "--out", "half"]) == 0
    assert "annotated now" in capsys.readouterr().out
    assert main(["stats", str(sim_run), "--format", "json"]) == 0
    before = {r["budget"]: r["mean_reward"] for r in json.loads(capsys.readouterr().out)["rows"]}
    assert main(["stats", str(sim_run), "--annotation", "half", "--format", "json"]) == 0
    after = {r["budget"]: r["mean_reward"] for r in json.loads(capsys.readouterr().out)["rows"]}
    assert before[8] == after[8] == 0.0
    assert before[512] > 0
    assert after == {b: pytest.approx(v / 2) for b, v in before.items()}
    rows = read_annotation(sim_run, "half").to_pylist()
    assert len({r["episode_id"] for r in rows}) == len(rows) == 3 * 4 * 4
    assert {r["grader_version"] for r in rows} == {"half-1"}
