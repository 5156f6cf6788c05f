"""Every reader works on a run that lives in S3 (a moto server on loopback, `tests/s3server.py`).

The runs are written by the local store (no Ray: episodes from `tests/record/factory.py`) and
uploaded key by key under a prefix, the layout an object-store writer leaves. The collector's
readers go through the synced local mirror (`collector.storage.mirror`); the plain readers
(pyarrow, polars, DuckDB) read the bucket itself, as the README shows.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow.dataset as ds
import pyarrow.fs
import pytest

from collector.analysis import get_episode, list_episodes, load_run, render_episode, truncation_table
from collector.cli import main
from collector.storage import mirror
from collector.storage.local import LocalRunStore
from collector.storage.location import ObjectLocation, parse_location
from collector.storage.manifest import COMMIT_RECORD_PREFIX, MANIFEST, read_manifest
from tests.faults.secret_scan import leaks_in
from tests.record.factory import make_batch
from tests.s3server import ACCESS_KEY_ID, SECRET_ACCESS_KEY, S3Bucket

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Mirrors in the test's tmp dir, never in the user's ~/.cache."""
    path = tmp_path / "cache"
    monkeypatch.setenv("COLLECTOR_CACHE_DIR", str(path))
    return path


def _write_run(run: Path, fmt: str, batches: list[tuple[str, int, int]]) -> Path:
    """Commit one batch of `n` episodes per (model, budget, n), in a local run dir (created or continued)."""
    with LocalRunStore.open(run, "fp", {}, fmt, 3) as store:  # type: ignore[arg-type]
        for i, (model, budget, n) in enumerate(batches):
            store.commit(make_batch(n, model=model, budget=budget, start=100 * i + len(store.shards)))
    return run


def _digests(run: Path) -> dict[str, str]:
    return {p.relative_to(run).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file()}


def _upload(bucket: S3Bucket, run: Path, prefix: str, only: set[str] | None = None) -> None:
    """Put every file of `run` (or those in `only`) at the same relative key under `prefix`."""
    for rel in _digests(run):
        if only is None or rel in only:
            bucket.client.put_object(Bucket=bucket.name, Key=f"{prefix}/{rel}", Body=(run / rel).read_bytes())


def _bucket_run(tmp_path: Path, bucket: S3Bucket, fmt: str = "parquet", prefix: str = "runs/r1"
                ) -> tuple[Path, str]:
    """A local run of two cells uploaded under `prefix`: (the local dir, its s3:// URI)."""
    run = _write_run(tmp_path / f"local-{fmt}", fmt, [("sim-a", 64, 7), ("sim-b", 128, 4)])
    _upload(bucket, run, prefix)
    return run, bucket.uri(prefix)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _index(uri: str) -> dict[str, Any]:
    location = parse_location(uri)
    assert isinstance(location, ObjectLocation)
    index: dict[str, Any] = json.loads(mirror.index_path(location).read_text())
    return index


def _manifest_rows(run: Path) -> int:
    return sum(entry["rows"] for entry in read_manifest(run)["shards"])


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_stats_of_the_bucket_is_the_table_of_the_local_run(
        tmp_path: Path, s3_bucket: S3Bucket, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    """`collector stats s3://...` prints the same table as on the run dir it was uploaded from."""
    run, uri = _bucket_run(tmp_path, s3_bucket, fmt)
    local = _cli(capsys, "stats", str(run))
    remote = _cli(capsys, "stats", uri)
    assert remote == local
    assert local[0] == 0
    assert "sim-b" in local[1]


def test_check_of_the_bucket_says_ok_and_reports_a_stray_file(
        tmp_path: Path, s3_bucket: S3Bucket, capsys: pytest.CaptureFixture[str]) -> None:
    """`collector check s3://...` is ok; a stray file in data/ on the bucket is reported (exit 1), and
    once the key is deleted the mirror drops it too (check is ok again)."""
    _, uri = _bucket_run(tmp_path, s3_bucket)
    code, out, _ = _cli(capsys, "check", uri)
    assert (code, out.splitlines()[-1]) == (0, f"{uri}: ok")
    stray = "runs/r1/data/part-999999-deadbeef.parquet"
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=stray, Body=b"PAR1 not committed")
    code, out, err = _cli(capsys, "check", uri)
    assert code == 1
    assert "data/part-999999-deadbeef.parquet: stray file" in out
    assert err.strip() == f"{uri}: 1 problem(s)"
    s3_bucket.client.delete_object(Bucket=s3_bucket.name, Key=stray)
    code, out, _ = _cli(capsys, "check", uri)
    assert (code, out.splitlines()[-1]) == (0, f"{uri}: ok")


def test_load_run_of_the_uri_equals_the_local_run(tmp_path: Path, s3_bucket: S3Bucket) -> None:
    """`load_run("s3://...")` returns the same table as `load_run` on the local run dir, and so do
    the analysis tables given the URI."""
    run, uri = _bucket_run(tmp_path, s3_bucket, "arrow")
    remote, local = load_run(uri), load_run(run)
    assert local.num_rows == 11
    assert remote.sort_by("episode_id").equals(local.sort_by("episode_id"))
    assert truncation_table(uri).equals(truncation_table(run))


def test_the_episode_functions_take_the_uri_from_python(tmp_path: Path, s3_bucket: S3Bucket) -> None:
    """From a notebook, `list_episodes`, `get_episode` and `render_episode` (by a unique id
    prefix) take the s3:// URI and answer as on the local run dir."""
    run, uri = _bucket_run(tmp_path, s3_bucket, "arrow")
    listed = list_episodes(uri, {"budget": "64"})
    assert listed.equals(list_episodes(run, {"budget": "64"}))
    assert listed.num_rows == 7
    first = listed.column("episode_id")[0].as_py()
    assert get_episode(uri, first) == get_episode(run, first)
    assert render_episode(uri, first[:12]) == render_episode(run, first[:12])


def test_episodes_show_export_and_trainer_view_read_the_bucket(
        tmp_path: Path, s3_bucket: S3Bucket, capsys: pytest.CaptureFixture[str]) -> None:
    """`episodes`, `show`, `export` and `trainer-view` give on the URI what they give on the local run."""
    run, uri = _bucket_run(tmp_path, s3_bucket)
    listing = _cli(capsys, "episodes", uri, "--format", "json")
    assert listing == _cli(capsys, "episodes", str(run), "--format", "json")
    first = json.loads(listing[1].splitlines()[0])["episode_id"]
    shown = _cli(capsys, "show", uri, first)
    assert shown[0] == 0
    assert shown == _cli(capsys, "show", str(run), first)
    outputs = []
    for source, name in ((uri, "remote"), (str(run), "local")):
        out = str(tmp_path / f"{name}.jsonl")
        code, _, err = _cli(capsys, "export", source, out, "--where", "model=sim-b")
        assert code == 0, err
        outputs.append((tmp_path / f"{name}.jsonl").read_text())
        # These episodes carry no token ids: on either source trainer-view says so, in one line.
        code, _, err = _cli(capsys, "trainer-view", source, str(tmp_path / f"{name}.parquet"))
        assert code == 2, err
        assert err.count("\n") == 1
        assert "no token ids to train on" in err
    assert outputs[0] == outputs[1]
    assert len(outputs[0].splitlines()) == 4


def test_a_new_commit_is_seen_and_only_its_keys_are_downloaded(
        tmp_path: Path, s3_bucket: S3Bucket, capsys: pytest.CaptureFixture[str]) -> None:
    """After a commit is uploaded, a second `stats` shows it, and the sync downloaded only the keys
    whose bytes changed: the new commit record and shard (every key re-put, most unchanged)."""
    run, uri = tmp_path / "local", s3_bucket.uri("runs/r1")
    with LocalRunStore.open(run, "fp", {}, "parquet", 3) as store:  # a writer still open: its commit log
        store.commit(make_batch(7, model="sim-a", budget=64))
        _upload(s3_bucket, run, "runs/r1")
        assert "sim-c" not in _cli(capsys, "stats", uri)[1]
        before = _digests(run)
        store.commit(make_batch(2, model="sim-c", budget=32))
        after = _digests(run)
        changed = {rel for rel, digest in after.items() if before.get(rel) != digest}
        assert changed == {f"{COMMIT_RECORD_PREFIX}000000002.json"} | {
            rel for rel in after if rel.startswith("data/") and rel not in before}
        _upload(s3_bucket, run, "runs/r1")  # everything again: unchanged bytes keep their ETag
        code, out, _ = _cli(capsys, "stats", uri)
        assert code == 0
        assert "sim-c" in out
    index = _index(uri)
    fetched = {rel for rel, entry in index["keys"].items() if entry["sync"] == index["syncs"]}
    assert fetched == changed
    assert set(index["keys"]) == set(after)


def test_a_compaction_during_the_sync_is_synced_again(
        tmp_path: Path, s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A writer compacting while the mirror downloads its commit records (a gap in the mirrored log)
    makes the reader sync again, and it reads the complete run, not an error."""
    run, uri = tmp_path / "local", s3_bucket.uri("runs/r1")
    with LocalRunStore.open(run, "fp", {}, "parquet", 3) as store:
        store.commit(make_batch(4, model="sim-a", budget=64))
        _upload(s3_bucket, run, "runs/r1")
        assert _cli(capsys, "stats", uri)[0] == 0  # the mirror holds the base and record 1
        store.commit(make_batch(2, model="sim-b", budget=64))
        store.commit(make_batch(2, model="sim-c", budget=64))
        _upload(s3_bucket, run, "runs/r1")
        folded = read_manifest(run)
    assert folded["log_through"] == 3
    real_download = mirror._download
    compacted: list[str] = []

    def download(client: Any, location: ObjectLocation, rel: str, target: Path, scratch: Path) -> Any:
        if rel == f"{COMMIT_RECORD_PREFIX}000000002.json" and not compacted:
            # The writer compacts now: the folded state as the new base, then records 1 and 2
            # deleted (record 3 not yet): the mirror gets the old base, records 1 and 3.
            s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=f"runs/r1/{MANIFEST}",
                                        Body=json.dumps(folded).encode())
            for seq in (1, 2):
                s3_bucket.client.delete_object(Bucket=s3_bucket.name,
                                               Key=f"runs/r1/{COMMIT_RECORD_PREFIX}{seq:09d}.json")
            compacted.append(rel)
        return real_download(client, location, rel, target, scratch)

    monkeypatch.setattr(mirror, "_download", download)
    table = load_run(uri)
    assert compacted
    assert table.num_rows == 8
    assert sorted(set(table.column("model").to_pylist())) == ["sim-a", "sim-b", "sim-c"]
    assert _index(uri)["syncs"] >= 3  # the first read, the raced sync, at least one more


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_pyarrow_polars_and_duckdb_read_the_bucket(tmp_path: Path, s3_bucket: S3Bucket, fmt: str) -> None:
    """pyarrow, polars and DuckDB (through a pyarrow dataset) read the bucket itself: the manifest's rows,
    for Parquet and Arrow IPC, with the run's hidden .collector/ files beside the data."""
    run, _ = _bucket_run(tmp_path, s3_bucket, fmt)
    expected = _manifest_rows(run)
    assert expected == 11
    s3 = pyarrow.fs.S3FileSystem(endpoint_override=os.environ["AWS_ENDPOINT_URL_S3"])
    root = f"{s3_bucket.name}/runs/r1"
    shards = ds.dataset(root, filesystem=s3, format="ipc" if fmt == "arrow" else "parquet")
    assert shards.count_rows() == expected
    scan = pl.scan_ipc if fmt == "arrow" else pl.scan_parquet
    frame = scan(f"s3://{root}/data/*.{fmt}").select(pl.len()).collect()
    assert frame.item() == expected
    counted = duckdb.sql("SELECT count(*) FROM shards").fetchall()
    assert counted == [(expected,)]


def test_no_credential_reaches_the_cache(
        tmp_path: Path, s3_bucket: S3Bucket, cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """After reads of the bucket (a first sync, an incremental one), the cache holds no credential."""
    run, uri = _bucket_run(tmp_path, s3_bucket)
    assert _cli(capsys, "check", uri)[0] == 0
    _write_run(run, "parquet", [("sim-c", 32, 2)])
    _upload(s3_bucket, run, "runs/r1")
    assert _cli(capsys, "stats", uri)[0] == 0
    assert any(cache_dir.rglob("*.parquet"))
    assert leaks_in(cache_dir, [SECRET_ACCESS_KEY, ACCESS_KEY_ID]) == []


def test_a_missing_bucket_is_one_line_and_exit_2(
        s3_bucket: S3Bucket, capsys: pytest.CaptureFixture[str]) -> None:
    """A bucket that does not exist: one line naming it, exit 2, no credential, no traceback."""
    uri = "s3://no-such-bucket-for-collector/run"
    code, out, err = _cli(capsys, "stats", uri)
    assert code == 2
    assert out == ""
    assert err == (f"collector: error: {uri}: bucket 'no-such-bucket-for-collector' does not exist\n")


def test_a_prefix_without_a_run_is_one_line_and_exit_2(
        s3_bucket: S3Bucket, capsys: pytest.CaptureFixture[str]) -> None:
    """A prefix holding no manifest is not a run: one line naming the URI, exit 2 (also for `check`)."""
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key="other/data/x.parquet", Body=b"x")
    for command in ("stats", "check"):
        code, out, err = _cli(capsys, command, s3_bucket.uri("other"))
        assert (code, out) == (2, "")
        assert err == f"collector: error: {s3_bucket.uri('other')} is not a run (no {MANIFEST} under it)\n"


def test_an_unreachable_endpoint_is_one_line_and_exit_2(
        tmp_path: Path, s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An endpoint nothing listens on: one line naming the run and the host, exit 2, no secret."""
    _, uri = _bucket_run(tmp_path, s3_bucket)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{_closed_port()}")
    code, out, err = _cli(capsys, "stats", uri)
    assert (code, out) == (2, "")
    shape = rf"collector: error: {re.escape(uri)}: cannot reach 127\.0\.0\.1:\d+ \(\w+\)\n"
    assert re.fullmatch(shape, err), err
    assert SECRET_ACCESS_KEY not in err


def test_without_boto3_the_error_names_the_extra(
        s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Without boto3 installed, reading a URI says in one line which extra to install (exit 2)."""
    monkeypatch.setitem(sys.modules, "boto3", None)
    code, _, err = _cli(capsys, "stats", s3_bucket.uri())
    assert code == 2
    assert err == (f"collector: error: {s3_bucket.uri()}: reading a run in object storage needs boto3, "
                   "which is not installed: pip install 'collector[s3]'\n")


def test_a_prefix_climbing_out_of_the_cache_is_refused(
        tmp_path: Path, s3_bucket: S3Bucket, capsys: pytest.CaptureFixture[str]) -> None:
    """`s3://bucket/../..`-style prefixes are one line, exit 2, and no file outside the cache is touched."""
    _bucket_run(tmp_path, s3_bucket)
    bystander = tmp_path / "keep.txt"
    bystander.write_text("mine")
    # S3 keys may hold such segments: with a manifest there, a sync of the "run" would mirror
    # it into tmp_path (cache/s3/<bucket>/runs/../../../..) and remove every file not a key.
    climbing = "runs/../../../.."
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=f"{climbing}/{MANIFEST}",
                                Body=(tmp_path / "local-parquet" / MANIFEST).read_bytes())
    assert f"{climbing}/{MANIFEST}" in s3_bucket.keys(prefix="runs/")
    code, out, err = _cli(capsys, "check", f"s3://{s3_bucket.name}/{climbing}")
    assert bystander.exists()
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert "'..' segments" in err


def test_directory_markers_are_not_files_and_escaping_keys_are_ignored(
        tmp_path: Path, s3_bucket: S3Bucket, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """A "folder" marker key (`data/`, as consoles create) is no file and no stray; a key climbing out
    of the run (`data/../../x`) is ignored with one warning naming it (one stray key must not make
    the run unreadable to every reader), and nothing is written outside."""
    _, uri = _bucket_run(tmp_path, s3_bucket)
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key="runs/r1/data/", Body=b"")
    code, out, _ = _cli(capsys, "check", uri)
    assert (code, out.splitlines()[-1]) == (0, f"{uri}: ok")
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key="runs/r1/data/../../../escaped", Body=b"x")
    caplog.clear()
    code, out, _ = _cli(capsys, "check", uri)
    assert (code, out.splitlines()[-1]) == (0, f"{uri}: ok")
    warned = [r.getMessage() for r in caplog.records if r.name == "collector.storage.mirror"]
    assert warned == [f"{uri}: key 'runs/r1/data/../../../escaped' is not a plain relative path "
                      "(outside the run's layout); ignored, not mirrored"]
    assert not list(tmp_path.rglob("escaped"))


def test_a_server_that_never_answers_ends_in_one_line(
        tmp_path: Path, s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An endpoint that accepts the connection and never replies ends (bounded read timeout and
    retries) in one line, exit 2, instead of hanging the reader."""
    import socket

    _, uri = _bucket_run(tmp_path, s3_bucket)
    monkeypatch.setattr(mirror, "READ_TIMEOUT_S", 0.2)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes the handshakes; nothing ever reads or answers
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{silent.getsockname()[1]}")
        code, out, err = _cli(capsys, "stats", uri)
    assert (code, out) == (2, "")
    assert re.fullmatch(rf"collector: error: {re.escape(uri)}: cannot reach 127\.0\.0\.1:\d+ "
                        r"\(ReadTimeoutError\)\n", err), err


@pytest.mark.parametrize(("code", "status", "says"), [
    ("AccessDenied", 403, "access to bucket 'b-1' denied"),
    ("InvalidAccessKeyId", 403, "the credentials were refused (InvalidAccessKeyId)"),
    ("SignatureDoesNotMatch", 403, "the credentials were refused (SignatureDoesNotMatch)"),
    ("SlowDown", 503, "the object store answered SlowDown (HTTP 503)"),
])
def test_store_errors_are_named_by_code_never_by_their_message(code: str, status: int, says: str) -> None:
    """Permission and credential failures name the bucket and the code; the server's message (which
    may quote the request) is never repeated."""
    from botocore.exceptions import ClientError

    error = ClientError({"Error": {"Code": code, "Message": f"key {SECRET_ACCESS_KEY}"},
                         "ResponseMetadata": {"HTTPStatusCode": status}}, "ListObjectsV2")
    message = str(mirror._store_error(ObjectLocation("s3", "b-1", "run"), error))
    assert message.startswith(f"s3://b-1/run: {says}")
    assert SECRET_ACCESS_KEY not in message


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
