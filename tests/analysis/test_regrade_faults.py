"""`collector regrade` under faults: a run in S3, two regrades of one NAME, graders that fail.

Every interleaving is an event (a hook that waits for the other regrade to reach a point),
never a timing guess; a hanging grader blocks on an event the test releases at its end.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.analysis.annotation_store import AnnotationFiles, LocalAnnotations
from collector.analysis.committed import read_committed
from collector.analysis.regrade import read_annotation, regrade_run
from collector.cli import main
from collector.errors import OutputError
from tests.analysis.test_regrade import SPEC, StrictArithmetic, StrictWorld, make_run
from tests.checking import assert_run_checked
from tests.s3server import S3Bucket

FOLDER = Path(".collector/annotations/strict")


def annotated_ids(run: Path, name: str = "strict") -> list[str]:
    return [str(i) for i in read_annotation(run, name).column("episode_id").to_pylist()]


def assert_exactly_once(run: Path) -> None:
    """Every committed episode annotated once, every chunk on disk named by a record."""
    ids = annotated_ids(run)
    assert sorted(ids) == sorted(read_committed(run, ["episode_id"]).column("episode_id").to_pylist())
    assert len(ids) == len(set(ids))
    folder = run / FOLDER
    named = {json.loads(p.read_text())["chunk"] for p in folder.glob("commit-*.json")}
    assert {p.name for p in folder.glob("chunk-*")} == named
    assert_run_checked(run)


# --- 1. a run in S3: the annotation is committed to the bucket ---------------------------------------


def test_regrade_of_a_run_in_s3_commits_the_annotation_to_the_bucket_exactly_once(
        tmp_path: Path, s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`collector regrade s3://...` writes its annotation to the bucket, so that another reader's
    mirror (or this one's next sync) sees it, and a second regrade annotates nothing twice."""
    monkeypatch.setenv("COLLECTOR_CACHE_DIR", str(tmp_path / "cache"))
    run = make_run(tmp_path)
    for path in sorted(run.rglob("*")):
        if path.is_file():
            s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=f"r/{path.relative_to(run).as_posix()}",
                                        Body=path.read_bytes())
    uri = s3_bucket.uri("r")
    assert main(["regrade", uri, "--env", SPEC, "--out", "strict"]) == 0
    assert "40 episodes annotated now, 40 in all" in capsys.readouterr().out
    keys = s3_bucket.keys("r/.collector/annotations/strict/")
    assert sum("/commit-" in k for k in keys) == 1
    assert sum("/chunk-" in k for k in keys) == 1
    # A reader on another machine: a fresh mirror, synced from the bucket alone.
    monkeypatch.setenv("COLLECTOR_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert main(["stats", uri, "--annotation", "strict"]) == 0
    capsys.readouterr()
    assert main(["regrade", uri, "--env", SPEC, "--out", "strict"]) == 0
    assert "0 episodes annotated now, 40 in all" in capsys.readouterr().out
    mirror = tmp_path / "elsewhere" / "s3" / s3_bucket.name / "r"
    assert main(["check", uri]) == 0
    assert_exactly_once(mirror)


# --- 2. two regrades of one NAME ---------------------------------------------------------------------


class Pausing(LocalAnnotations):
    """The local folder without the flock (what S3, or a filesystem without flock, gives), whose
    first commit record waits at `before_record` (the chunk written, the record not yet made)."""

    def __init__(self, folder: Path, before_record: Any = None) -> None:
        super().__init__(folder)
        self.before_record = before_record

    def exclusive(self, refusal: str) -> Any:
        return AnnotationFiles.exclusive(self, refusal)

    def create(self, name: str, data: bytes) -> bool:
        if name.startswith("commit-") and self.before_record is not None:
            hook, self.before_record = self.before_record, None
            hook()
        return super().create(name, data)


def test_a_second_regrade_of_one_name_is_refused_before_it_changes_anything(tmp_path: Path) -> None:
    """While a regrade of NAME runs, a second one is refused in one line at once: the first's
    files are untouched, and it commits every episode once."""
    run = make_run(tmp_path)
    folder = run / FOLDER
    waiting, go = threading.Event(), threading.Event()

    def hold() -> None:
        waiting.set()
        go.wait(60)

    first = Pausing(folder, hold)
    first_exclusive = LocalAnnotations.exclusive  # the first one does take the flock
    first.exclusive = lambda refusal: first_exclusive(first, refusal)  # type: ignore[method-assign]
    errors: list[BaseException] = []

    def run_first() -> None:
        try:
            regrade_run(run, StrictArithmetic(), SPEC, "strict", files=first)
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    thread = threading.Thread(target=run_first)
    thread.start()
    assert waiting.wait(60)  # the first wrote its chunk and is about to create its record
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(OutputError) as caught:
        regrade_run(run, StrictArithmetic(), SPEC, "strict")
    assert "another regrade of 'strict' is running" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    go.set()
    thread.join(60)
    assert not errors
    assert_exactly_once(run)


def test_without_a_lock_an_orphan_is_decided_by_the_commit_record_not_by_timing(tmp_path: Path) -> None:
    """Where no flock refuses the second regrade (S3), it never deletes the first's chunk while
    the first is between chunk and record; the loser of the record is refused in one line
    and the annotation stays readable, every episode once."""
    run = make_run(tmp_path)
    folder = run / FOLDER
    waiting, go = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        waiting.set()
        go.wait(60)

    def run_first() -> None:
        try:
            regrade_run(run, StrictArithmetic(), SPEC, "strict", files=Pausing(folder, hold))
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    thread = threading.Thread(target=run_first)
    thread.start()
    assert waiting.wait(60)
    first_chunk = {p.name for p in folder.glob("chunk-*")}
    assert len(first_chunk) == 1

    def let_the_first_commit() -> None:  # the second, graded, about to create the same record
        assert {p.name for p in folder.glob("chunk-*")} >= first_chunk  # not deleted on its start
        go.set()
        thread.join(60)

    with pytest.raises(OutputError) as caught:
        regrade_run(run, StrictArithmetic(), SPEC, "strict", files=Pausing(folder, let_the_first_commit))
    assert re.search(r"commit-000000001\.json was created meanwhile by another regrade", str(caught.value))
    assert not errors
    assert_exactly_once(run)


# --- 12. graders that fail ---------------------------------------------------------------------------

_release = threading.Event()
_calls = {"n": 0}


class FaultyWorld(StrictWorld):
    fault: str = ""
    at: int = 3

    def grade(self, final_text: str | None) -> Any:
        _calls["n"] += 1
        if _calls["n"] != self.at:
            return super().grade(final_text)
        if self.fault == "raise":
            raise RuntimeError("the rubric file\nis missing")
        if self.fault == "secret":
            raise PermissionError(f"rubric server refused token {SECRET} at https://u:{SECRET}@rubric")
        if self.fault == "hang":
            _release.wait(120)  # a synchronous grader stuck: only the deadline gets the regrade out
            return 0.5
        if self.fault == "async-hang":
            async def never() -> float:
                await asyncio.Event().wait()
                return 0.5

            return never()
        wrong = {"string": "0.5", "none": None, "huge": 10 ** 400, "nan": float("nan"), "bool": True}
        return wrong[self.fault]


SECRET = "rubric-token-never-shown"


class FaultyArithmetic(StrictArithmetic):
    def start(self, task: Any, context: Any = None) -> FaultyWorld:
        return FaultyWorld(449)

    def credentials(self) -> tuple[str, ...]:
        return (SECRET,)


@pytest.fixture
def release_graders() -> Iterator[None]:
    _calls["n"] = 0
    _release.clear()
    yield
    _release.set()  # lets an abandoned grader thread end


@pytest.mark.usefixtures("release_graders")
@pytest.mark.parametrize(("fault", "cause"), [
    ("raise", "raised RuntimeError: the rubric file is missing"),
    ("string", "returned '0.5' (str), not a number"),
    ("none", "returned None (NoneType), not a number"),
    ("bool", "returned True (bool), not a number"),
    ("huge", "returned an integer of 1329 bits, too large for a reward"),
    ("nan", "returned nan, not a finite number"),
    ("hang", "did not finish within 0.3 s (abandoned)"),
    ("async-hang", "did not finish within its 0.1 s bound"),
])
def test_a_failing_grader_is_one_line_naming_the_episode_and_keeps_what_was_annotated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, cause: str) -> None:
    """A grader that raises, returns no reward or hangs (synchronous or async) stops the
    regrade with one line naming the episode and the cause; the episodes graded before it
    stay annotated, and a rerun with a working grader annotates the rest exactly once."""
    run = make_run(tmp_path)
    monkeypatch.setattr(FaultyWorld, "fault", fault)
    with pytest.raises(OutputError) as caught:
        regrade_run(run, FaultyArithmetic(), SPEC, "strict", batch=4, timeout_s=0.1)
    message = str(caught.value)
    assert "\n" not in message
    assert cause in message, message
    failed = re.match(r"episode (\S+): the grader ", message)
    assert failed is not None, message
    rows = sorted(read_committed(run, ["episode_id", "stop_reason"]).to_pylist(),
                  key=lambda r: str(r["episode_id"]))
    graded = [r["episode_id"] for r in rows if r["stop_reason"] == "done"]
    assert failed.group(1) == graded[FaultyWorld.at - 1]  # the third grade, named
    before = [r["episode_id"] for r in rows][:[r["episode_id"] for r in rows].index(failed.group(1))]
    assert annotated_ids(run) == before  # all graded before it, its batch's included
    regrade_run(run, StrictArithmetic(), SPEC, "strict", batch=4)
    assert_exactly_once(run)


def test_the_cli_prints_a_failing_grader_as_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The user sees `collector: error: episode ...: the grader ...` and exit 2, no traceback."""
    run = make_run(tmp_path)
    monkeypatch.setattr(FaultyWorld, "fault", "none")
    _calls["n"] = 0
    assert main(["regrade", str(run), "--env", "tests.analysis.test_regrade_faults:FaultyArithmetic",
                 "--out", "strict"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"collector: error: episode \S+: the grader returned None \(NoneType\), "
                        r"not a number\n", err)


@pytest.mark.usefixtures("release_graders")
def test_a_failing_graders_line_holds_none_of_the_environments_credentials(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The grader's message is shown, with the credentials the environment declares replaced."""
    run = make_run(tmp_path)
    monkeypatch.setattr(FaultyWorld, "fault", "secret")
    with pytest.raises(OutputError) as caught:
        regrade_run(run, FaultyArithmetic(), SPEC, "strict")
    assert SECRET not in str(caught.value)
    assert "raised PermissionError: rubric server refused token [redacted credential]" in str(caught.value)
