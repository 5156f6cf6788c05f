"""`check_run`: each invariant violation is found and named in one line; damaged files never crash it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from collector.analysis.check import MAX_PROBLEMS, check_run
from collector.record import shards
from collector.record.episode import Episode, ExecutedToolCall, MessageRecord
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from collector.storage.manifest import MANIFEST, TMP_DIR, NotARunDirectory
from tests.record.factory import make_batch, make_episode

S = StopReason
BOTH = {"loop": {"stop_on": ["length", "malformed_tool_call"], "reward": {"policy": "zero"}}}


def commit(run: Path, episodes: list[Episode], config: dict[str, Any] | None = None) -> Path:
    with LocalRunStore.open(run, "fp", BOTH if config is None else config, "arrow", 100) as st:
        st.commit(episodes)
    return run


def clean() -> list[Episode]:
    return make_batch(12, stops=tuple(StopReason))


def test_a_clean_run_is_ok(tmp_path: Path) -> None:
    """A run of well-formed episodes of every stop reason passes with no problems and no notes."""
    report = check_run(commit(tmp_path / "run", clean()))
    assert report.ok, report.problems
    assert (report.shards, report.episodes) == (1, 12)
    assert report.notes == []
    assert report.summary().endswith("1 shards, 12 episodes: ok")


def _exec_from_cut_turn(ep: Episode) -> None:
    ep.executed_tool_calls.append(ExecutedToolCall(1, "call_2", "calculator", "{}", False))


def _unsettled(ep: Episode) -> None:
    ep.messages = [m for m in ep.messages if m.call_id != "call_1"]


def _settled_twice(ep: Episode) -> None:
    ep.messages.insert(4, MessageRecord(role="tool", text="449 again", call_id="call_1", turn_index=0))


def _unknown_result(ep: Episode) -> None:
    ep.messages.append(MessageRecord(role="tool", text="?", call_id="call_99", turn_index=1))


def _rewarded_cut(ep: Episode) -> None:
    ep.reward = 1.0


def _trainable_error(ep: Episode) -> None:
    ep.trainable = True


def _error_without_record(ep: Episode) -> None:
    ep.error = None


def _went_on_after_cut(ep: Episode) -> None:
    ep.turns[0].finish_class = "length"
    ep.turns[0].length_signals = ["cap_reached"]


def _went_on_after_malformed(ep: Episode) -> None:
    ep.turns[0].malformed_calls = 1


def _wrong_id(ep: Episode) -> None:
    ep.task_id = "someone-else"


def _exec_malformed(ep: Episode) -> None:
    ep.messages[2].tool_calls[0].status = "malformed"


CASES: list[tuple[str, StopReason, Callable[[Episode], None], str]] = [
    ("executed from a cut turn", S.LENGTH, _exec_from_cut_turn, "cut by the output-token limit"),
    ("call never settled", S.DONE, _unsettled, "call_1 of turn 0 was never settled"),
    ("call settled twice", S.DONE, _settled_twice, "settled twice"),
    ("result for an unknown call", S.LENGTH, _unknown_result, "call_99"),
    ("reward on a length episode", S.LENGTH, _rewarded_cut, "reward 1.0 for a length episode"),
    ("reward on a malformed episode", S.MALFORMED_TOOL_CALL, _rewarded_cut, "malformed_tool_call episode"),
    ("trainable error", S.ERROR, _trainable_error, "error episode marked trainable"),
    ("error without a record", S.ERROR, _error_without_record, "without an error record"),
    ("trainable timeout", S.TIMEOUT, _trainable_error, "timeout episode marked trainable"),
    ("episode went on after a cut", S.DONE, _went_on_after_cut, "was cut but the episode went on"),
    ("episode went on after malformed", S.DONE, _went_on_after_malformed, "had a malformed tool call"),
    ("id not deterministic", S.DONE, _wrong_id, "id is not episode_id"),
    ("executed malformed call", S.DONE, _exec_malformed, "executed with malformed arguments"),
]


@pytest.mark.parametrize(("name", "stop", "breaker", "phrase"), CASES, ids=[c[0] for c in CASES])
def test_each_violation_is_found(
    tmp_path: Path, name: str, stop: StopReason, breaker: Callable[[Episode], None], phrase: str
) -> None:
    """Breaking one invariant in one episode gives problem lines naming the shard, the episode, the rule."""
    bad = make_episode(stop, task="bad")
    breaker(bad)
    report = check_run(commit(tmp_path / "run", [*clean(), bad]))
    assert not report.ok
    assert any(phrase in line for line in report.problems), report.problems
    for line in report.problems:  # some breaks violate two rules at once (a cut turn that ran a tool)
        assert bad.episode_id in line
        assert line.startswith("data/part-")
        assert "\n" not in line


def test_stop_on_comes_from_the_resolved_config(tmp_path: Path) -> None:
    """With length not in stop_on, a cut turn followed by more turns is legitimate."""
    ep = make_episode(S.DONE, task="x")
    _went_on_after_cut(ep)
    ep.executed_tool_calls.clear()  # nothing from the cut turn ran
    config = {"loop": {"stop_on": ["malformed_tool_call"], "reward": {"policy": "zero"}}}
    assert check_run(commit(tmp_path / "run", [ep], config)).ok


def test_grade_then_clamp_allows_negative_never_positive(tmp_path: Path) -> None:
    """Under grade_then_clamp a stop_on episode may carry a negative reward, never a positive one."""
    config = {"loop": {"stop_on": ["length"], "reward": {"policy": "grade_then_clamp"}}}
    neg = make_episode(S.LENGTH, task="neg")
    neg.reward = -1.0
    assert check_run(commit(tmp_path / "a", [neg], config)).ok
    pos = make_episode(S.LENGTH, task="pos")
    pos.reward = 0.5
    assert not check_run(commit(tmp_path / "b", [pos], config)).ok


def _add_to_manifest(run: Path, rel: str, rows: int, model: str = "sim-perfect", budget: int = 128) -> None:
    manifest = json.loads((run / MANIFEST).read_text())
    manifest["shards"].append({"path": rel, "rows": rows, "model": model, "budget": budget})
    (run / MANIFEST).write_text(json.dumps(manifest))


def test_duplicate_ids_across_shards(tmp_path: Path) -> None:
    """The same episode in two committed shards is reported with both file names."""
    run = commit(tmp_path / "run", clean())
    shard = next(run.glob("data/part-*.arrow"))
    copy = shard.with_name("part-000777-copy0000.arrow")
    shutil.copy(shard, copy)
    _add_to_manifest(run, copy.relative_to(run).as_posix(), 12)
    report = check_run(run)
    assert report.found == 12
    assert all("duplicate episode id" in p and shard.name in p for p in report.problems)


def _write_extra(run: Path, table: pa.Table, name: str) -> str:
    path = run / "data" / name
    shards.write_shard(path, table, "arrow")
    rel = path.relative_to(run).as_posix()
    _add_to_manifest(run, rel, table.num_rows)
    return rel


def test_wrong_schema_version_and_wrong_schema(tmp_path: Path) -> None:
    """A shard of another schema version, and one missing a column, are each named."""
    run = commit(tmp_path / "run", clean())
    table = shards.episodes_to_table(make_batch(2, start=100))
    old = _write_extra(run, table.replace_schema_metadata({shards.SCHEMA_VERSION_KEY: b"0"}), "part-a.arrow")
    narrow = _write_extra(run, table.drop_columns(["reward"]), "part-b.arrow")
    report = check_run(run)
    assert any(p.startswith(old) and "schema version 0" in p for p in report.problems)
    assert any(p.startswith(narrow) and "reward" in p for p in report.problems)


def test_manifest_row_count_and_partition_mismatch(tmp_path: Path) -> None:
    """Rows that disagree with the manifest's count or with their partition are reported."""
    run = commit(tmp_path / "run", clean())
    manifest = json.loads((run / MANIFEST).read_text())
    manifest["shards"][0]["rows"] = 11
    manifest["shards"][0]["budget"] = 64
    (run / MANIFEST).write_text(json.dumps(manifest))
    problems = check_run(run).problems
    assert any("12 rows, the manifest says 11" in p for p in problems)
    assert any("budget [128] in the partition of 64" in p for p in problems)


@pytest.mark.parametrize("damage", ["truncate", "zeros", "delete"])
def test_damaged_shard_is_one_line_not_a_crash(tmp_path: Path, damage: str) -> None:
    """A truncated, zeroed or missing committed shard is one problem line naming the file."""
    run = commit(tmp_path / "run", clean())
    shard = next(run.glob("data/part-*.arrow"))
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:100])
    elif damage == "zeros":
        shard.write_bytes(bytes(shard.stat().st_size))
    else:
        shard.unlink()
    report = check_run(run)
    assert len(report.problems) == 1
    assert shard.name in report.problems[0]
    assert "\n" not in report.problems[0]


def test_every_stray_file_is_a_problem_and_hidden_leftovers_are_notes(tmp_path: Path) -> None:
    """A file a plain reader sees outside the manifest fails check; hidden temp files are notes."""
    run = commit(tmp_path / "run", clean())
    shard = next(run.glob("data/part-*.arrow"))
    shutil.copy(shard, run / "data" / "part-000500-orphan00.arrow")  # a shard copied in by hand
    (run / "data" / "nested").mkdir()
    (run / "data" / "nested" / "part-000501-broken00.arrow").write_bytes(b"not arrow")
    (run / "notes.txt").write_text("mine")
    (run / TMP_DIR / "part-000502-halfway0.arrow.tmp").write_bytes(b"half")
    report = check_run(run)
    assert not report.ok
    assert len(report.problems) == 3
    for name in ("data/part-000500-orphan00.arrow", "data/nested/part-000501-broken00.arrow", "notes.txt"):
        assert any(p.startswith(f"{name}: stray file, not in the manifest") for p in report.problems), name
    assert any("part-000502-halfway0.arrow.tmp: temporary file" in n for n in report.notes)


def test_check_exits_1_and_prints_a_stray_and_the_notes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`collector check` exits 1 for one stray shard, printing its name, and prints the notes it found."""
    from collector.cli import main

    run = commit(tmp_path / "run", clean())
    (run / TMP_DIR / "part-000502-halfway0.arrow.tmp").write_bytes(b"half")
    assert main(["check", str(run)]) == 0
    assert "note: .collector/tmp/part-000502-halfway0.arrow.tmp" in capsys.readouterr().out
    shard = next(run.glob("data/part-*.arrow"))
    shutil.copy(shard, run / "data" / "part-000500-orphan00.arrow")
    assert main(["check", str(run)]) == 1
    assert "data/part-000500-orphan00.arrow: stray file" in capsys.readouterr().out


def test_not_a_run_dir(tmp_path: Path) -> None:
    """A directory without a manifest is bad input (NotARunDirectory), not a problem found in a run."""
    with pytest.raises(NotARunDirectory, match=r"no \.collector/manifest\.json"):
        check_run(tmp_path)


def test_problem_list_is_capped(tmp_path: Path) -> None:
    """Thousands of violations are counted in full but listed only up to MAX_PROBLEMS (+1 line)."""
    bad = make_batch(MAX_PROBLEMS + 50, stops=(S.ERROR,))
    for ep in bad:
        ep.trainable = True
    report = check_run(commit(tmp_path / "run", bad))
    assert report.found == MAX_PROBLEMS + 50
    assert len(report.problems) == MAX_PROBLEMS + 1
    assert f"{MAX_PROBLEMS + 50} problem(s)" in report.summary()
