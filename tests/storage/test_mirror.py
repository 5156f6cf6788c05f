"""The readers' mirror of a run in S3 (`collector.storage.mirror`): a damaged local copy is
verified against the manifest, fetched again and reported as the local mirror's (never the
bucket's), and a key outside the run's layout is ignored with a warning instead of making the
run unreadable."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.analysis import load_run
from collector.cli import main
from collector.storage.local import LocalRunStore
from collector.storage.manifest import read_manifest
from collector.storage.mirror import resolve_run
from tests.record.factory import make_batch
from tests.s3server import S3Bucket

PREFIX = "runs/m1"


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Mirrors in the test's tmp dir, never in the user's ~/.cache."""
    path = tmp_path / "cache"
    monkeypatch.setenv("COLLECTOR_CACHE_DIR", str(path))
    return path


def bucket_run(tmp_path: Path, bucket: S3Bucket) -> tuple[Path, str]:
    """A local run of 7 episodes uploaded key by key under PREFIX: (the local dir, its URI)."""
    run = tmp_path / "local"
    with LocalRunStore.open(run, "fp", {}, "arrow", 3) as st:
        st.commit(make_batch(7))
    for path in sorted(run.rglob("*")):
        if path.is_file():
            key = f"{PREFIX}/{path.relative_to(run).as_posix()}"
            bucket.client.put_object(Bucket=bucket.name, Key=key, Body=path.read_bytes())
    return run, bucket.uri(PREFIX)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The mirror's warnings since the last call (stderr in a CLI: logging's last resort)."""
    lines = [r.getMessage() for r in caplog.records
             if r.name == "collector.storage.mirror" and r.levelname == "WARNING"]
    caplog.clear()
    return lines


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_local_copy_is_fetched_again_and_blamed_on_the_mirror(
        tmp_path: Path, s3_bucket: S3Bucket, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture, damage: str) -> None:
    run, uri = bucket_run(tmp_path, s3_bucket)
    code, out, _ = cli(capsys, "check", uri)
    assert (code, out.splitlines()[-1]) == (0, f"{uri}: ok")
    mirror = resolve_run(uri)
    rel = read_manifest(mirror)["shards"][0]["path"]
    copy = mirror / rel
    data = bytearray(copy.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    else:
        del data[len(data) // 2:]
    copy.write_bytes(bytes(data))
    said(caplog)
    code, out, _ = cli(capsys, "check", uri)
    assert (code, out.splitlines()[-1]) == (0, f"{uri}: ok"), out
    warnings = said(caplog)
    assert len(warnings) == 1
    assert f"{rel} in the local mirror" in warnings[0]
    assert "fetched again" in warnings[0]
    assert copy.read_bytes() == (run / rel).read_bytes()
    code, _, _ = cli(capsys, "check", uri)  # repaired: nothing to say the next time
    assert (code, said(caplog)) == (0, [])


def test_a_damaged_object_in_the_bucket_is_still_the_buckets_problem(
        tmp_path: Path, s3_bucket: S3Bucket, capsys: pytest.CaptureFixture[str]) -> None:
    """Fetching again cannot repair what the bucket holds: `check` reports the shard."""
    run, uri = bucket_run(tmp_path, s3_bucket)
    rel = read_manifest(run)["shards"][0]["path"]
    data = bytearray((run / rel).read_bytes())
    data[len(data) // 2] ^= 0xFF
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=f"{PREFIX}/{rel}", Body=bytes(data))
    code, out, _ = cli(capsys, "check", uri)
    assert code == 1
    assert rel in out


@pytest.mark.parametrize("stray", ["data/../../../escaped", "data//doubled", "./dotted",
                                   "{shard}/inside-a-shard"])
def test_a_key_outside_the_runs_layout_is_ignored_with_a_warning(
        tmp_path: Path, s3_bucket: S3Bucket, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture, stray: str) -> None:
    run, uri = bucket_run(tmp_path, s3_bucket)
    stray = stray.format(shard=read_manifest(run)["shards"][0]["path"])
    key = f"{PREFIX}/{stray}"
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=key, Body=b"x")
    code, out, err = cli(capsys, "check", uri)
    assert (code, out.splitlines()[-1]) == (0, f"{uri}: ok"), (out, err)
    warnings = said(caplog)
    assert warnings
    assert all(f"key {key!r}" in w and "ignored, not mirrored" in w for w in warnings)
    assert not list(tmp_path.rglob("escaped"))
    assert load_run(uri, columns=["episode_id"]).num_rows == 7  # every reader still reads the run
