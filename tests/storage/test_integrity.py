"""Damaged runs: size and checksum verified on open, and one-line errors (never tracebacks) on read."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from collector import cli
from collector.analysis import get_episode, load_run, truncation_table
from collector.analysis.check import check_run
from collector.errors import OutputError
from collector.record.shards import ShardError
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from collector.storage.manifest import MANIFEST, QUARANTINE, read_manifest
from tests.record.factory import make_batch

STOPS = (StopReason.DONE, StopReason.LENGTH, StopReason.MALFORMED_TOOL_CALL, StopReason.ERROR)


def _run(tmp_path: Path) -> tuple[Path, list[Any]]:
    """A run of two shards (8 episodes each) in one partition; returns it and the episodes."""
    run = tmp_path / "run"
    work = make_batch(16, stops=STOPS)
    with LocalRunStore.open(run, "fp", {}, "arrow", 8) as st:
        st.commit(work[:8])
        st.commit(work[8:])
    return run, work


def _shard(run: Path, index: int = 0) -> Path:
    return run / read_manifest(run)["shards"][index]["path"]


def _flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))


def _edit_manifest(run: Path, edit: Any) -> None:
    manifest = json.loads((run / MANIFEST).read_text())
    edit(manifest)
    (run / MANIFEST).write_text(json.dumps(manifest))


def test_commit_records_size_and_checksum(tmp_path: Path) -> None:
    """Every manifest entry carries the shard's byte size and its sha256, matching the file."""
    run, _ = _run(tmp_path)
    for entry in read_manifest(run)["shards"]:
        data = (run / entry["path"]).read_bytes()
        assert entry["size"] == len(data)
        assert entry["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()


def test_one_damaged_byte_mid_shard_is_quarantined_on_open(tmp_path: Path) -> None:
    """A byte flipped inside a column that episode_id alone never touches is caught by the checksum."""
    run, work = _run(tmp_path)
    victim = _shard(run)
    _flip_middle_byte(victim)
    with LocalRunStore.open(run, "fp", {}, "arrow", 8) as st:
        assert len(st.warnings) == 1
        assert victim.name in st.warnings[0]
        assert "checksum" in st.warnings[0]
        assert st.committed_ids() == {e.episode_id for e in work[8:]}
        assert st.commit(work) == 8  # the damaged shard's episodes run again
    assert not victim.exists()
    assert [p.name for p in (run / QUARANTINE).iterdir()] == [f"data__{victim.name}.quarantined"]
    assert check_run(run).ok


def test_a_size_mismatch_is_quarantined(tmp_path: Path) -> None:
    """A shard that grew after commit (bytes appended) is quarantined, its ids not committed."""
    run, work = _run(tmp_path)
    victim = _shard(run, 1)
    with victim.open("ab") as f:
        f.write(b"\0")
    with LocalRunStore.open(run, "fp", {}, "arrow", 8) as st:
        assert len(st.warnings) == 1
        assert "bytes, the manifest says" in st.warnings[0]
        assert st.committed_ids() == {e.episode_id for e in work[:8]}


def test_old_manifest_without_checksums_falls_back_to_a_full_decode(tmp_path: Path) -> None:
    """Entries without size and checksum are kept when intact; a damaged one fails the full decode."""

    def strip(manifest: dict[str, Any]) -> None:
        for entry in manifest["shards"]:
            del entry["size"], entry["checksum"]

    run, work = _run(tmp_path)
    _edit_manifest(run, strip)
    with LocalRunStore.open(run, "fp", {}, "arrow", 8) as st:
        assert st.warnings == []
        assert st.committed_ids() == {e.episode_id for e in work}
    victim = _shard(run)
    _flip_middle_byte(victim)
    with LocalRunStore.open(run, "fp", {}, "arrow", 8) as st:
        assert len(st.warnings) == 1
        assert victim.name in st.warnings[0]
        assert st.committed_ids() == {e.episode_id for e in work[8:]}


def test_check_reports_a_checksum_mismatch(tmp_path: Path) -> None:
    """`collector check` names a committed shard whose bytes differ from those committed."""
    run, _ = _run(tmp_path)
    victim = _shard(run)
    data = bytearray(victim.read_bytes())
    data[300] ^= 0x01  # in the leading schema copy: every reader still decodes the file
    victim.write_bytes(bytes(data))
    problems = check_run(run).problems
    assert problems == [f"{read_manifest(run)['shards'][0]['path']}: checksum differs from the one "
                        "recorded at commit (file damaged)"]


def _damage(run: Path, how: str) -> str:
    """Damage the first committed shard (or its manifest entry) without reopening; return what to name."""
    victim = _shard(run)
    if how == "garbage":
        victim.write_bytes(b"\x13" * victim.stat().st_size)
    elif how == "truncated":
        victim.write_bytes(victim.read_bytes()[:700])
    elif how == "missing":
        victim.unlink()
    else:
        _edit_manifest(run, lambda m: m["shards"][0].pop("path"))
        return MANIFEST
    return victim.name


DAMAGE = ["garbage", "truncated", "missing", "entry without path"]


@pytest.mark.parametrize("how", DAMAGE)
def test_stats_on_a_damaged_run_is_one_line_and_exit_2(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`collector stats` over a bad committed shard prints one line naming the file and exits 2."""
    run, _ = _run(tmp_path)
    named = _damage(run, how)
    assert cli.main(["stats", str(run)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert named in err
    assert "Traceback" not in err


@pytest.mark.parametrize("how", DAMAGE)
def test_show_on_a_damaged_run_is_one_line_and_exit_2(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`collector show` of an episode behind a bad committed shard prints one line naming it, exit 2."""
    run, work = _run(tmp_path)
    named = _damage(run, how)
    assert cli.main(["show", str(run), work[12].episode_id]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert named in err
    assert "Traceback" not in err


@pytest.mark.parametrize("how", DAMAGE)
def test_load_run_and_the_notebook_tables_raise_output_error(tmp_path: Path, how: str) -> None:
    """`load_run`, `truncation_table` and `get_episode` raise a one-line OutputError naming the file."""
    run, work = _run(tmp_path)
    named = _damage(run, how)
    calls = [lambda: load_run(run), lambda: truncation_table(run),
             lambda: load_run(run, columns=["model", "reward"]), lambda: get_episode(run, work[3].episode_id)]
    for call in calls:
        with pytest.raises(OutputError) as info:
            call()
        assert named in str(info.value)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("not an object", "is not an object"),
        ({"rows": 8, "model": "m", "budget": 1}, 'has no "path"'),
        ({"path": "../elsewhere/part.arrow", "rows": 8, "model": "m", "budget": 1}, "outside the run dir"),
        ({"path": "/etc/part.arrow", "rows": 8, "model": "m", "budget": 1}, "outside the run dir"),
        ({"path": "model=m/budget=1/notes.txt", "rows": 8, "model": "m", "budget": 1}, "not a shard"),
        ({"path": "model=m/budget=1/p.arrow", "rows": "8", "model": "m", "budget": 1}, '"rows"'),
        ({"path": "model=m/budget=1/p.arrow", "rows": 8, "model": "m", "budget": 1, "size": -1}, '"size"'),
    ],
)
def test_read_manifest_refuses_a_bad_entry_in_one_line(tmp_path: Path, entry: Any, why: str) -> None:
    """A malformed shard entry is an OutputError naming the manifest, the entry and what is wrong."""
    run, _ = _run(tmp_path)
    _edit_manifest(run, lambda m: m["shards"].append(entry))
    with pytest.raises(OutputError) as info:
        read_manifest(run)
    message = str(info.value)
    assert message.startswith(f"{run / MANIFEST}: shard entry 2 ")
    assert why in message
    assert "\n" not in message
    with pytest.raises(OutputError, match="shard entry 2"):
        LocalRunStore.open(run, "fp", {}, "arrow", 8)
    assert not check_run(run).ok


def test_shard_error_pickles_with_its_parts() -> None:
    """ShardError survives pickling (it may cross a Ray boundary) with path and reason intact."""
    err = pickle.loads(pickle.dumps(ShardError("a/b.arrow", "ArrowInvalid: bad")))
    assert isinstance(err, OutputError)
    assert (err.path, err.reason) == ("a/b.arrow", "ArrowInvalid: bad")
    assert str(err) == "a/b.arrow: ArrowInvalid: bad"
