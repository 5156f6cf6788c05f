"""`collector run` with `output.path = "s3://..."` (a moto server on loopback): every episode
committed once, a rerun resumes with nothing to run, no credential in the bucket or the output,
and S3 failures (a missing bucket, a wrong secret key) are one line and exit 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from collector.storage.s3store import S3RunStore
from tests.faults.secret_scan import leaks_in
from tests.s3server import REGION, SECRET_ACCESS_KEY, S3Bucket

REPO = Path(__file__).resolve().parents[3]
CONFIG = """
name = "s3run"
[sweep]
models = ["sim-terse"]
budgets = [64, 128]
[env]
name = "arithmetic"
tasks = 6
[ray]
workers = 1
cpus_per_worker = 0.5
[output]
path = "{path}"
rows_per_shard = 4
worker_writes = {worker_writes}
"""


def run_collector(config: Path, env_over: dict[str, str], *options: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(env_over)
    env["PYTHONPATH"] = str(REPO)
    env.setdefault("COLLECTOR_CACHE_DIR", str(config.parent / "cache"))  # never the user's ~/.cache
    argv = [sys.executable, "-m", "collector", "run", str(config), "--quiet", *options]
    return subprocess.run(argv, env=env, text=True, capture_output=True, timeout=300, cwd=config.parent)


def write_config(tmp_path: Path, path: str, worker_writes: str = '"auto"') -> Path:
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.format(path=path, worker_writes=worker_writes))
    return config


# On the in-process pool (`--in-process`): the subject is the CLI's run into a bucket (its
# commits, table, check, resume and the secrets kept out), the same driver, store, sink and
# commits as on Ray without a Ray start (8-10 s of CPU each). Ray workers writing a bucket's
# shards from their own environment, as a real cluster's nodes do, are the Ray tests':
# test_driver_sigkill.py[s3-worker-writes] (every id once, written by the workers, after kills)
# and test_worker_write_kill.py (a Ray worker killed holding its pending object).
@pytest.mark.parametrize(("worker_writes", "writer"), [('"auto"', "worker"), ("false", "driver")])
def test_collector_run_into_s3_commits_every_episode_once_and_resumes(
    tmp_path: Path, s3_bucket: S3Bucket, worker_writes: str, writer: str
) -> None:
    """A run into a bucket commits all 12 episodes once and prints their statistics, written by
    the workers (the default for object storage) or by the driver; `collector check` passes on
    the bucket; the rerun has nothing to run; no secret stored."""
    config = write_config(tmp_path, s3_bucket.uri(), worker_writes)
    first = run_collector(config, s3_bucket.env(), "--in-process")
    assert first.returncode == 0, first.stderr
    assert "12/12 episodes committed" in first.stderr
    table = [line.split() for line in first.stdout.splitlines() if line.startswith("sim-terse")]
    assert sorted((row[1], row[2]) for row in table) == [("128", "6"), ("64", "6")]  # budget, episodes
    env = {**os.environ, **s3_bucket.env(), "COLLECTOR_CACHE_DIR": str(tmp_path / "cache")}
    check = subprocess.run([sys.executable, "-m", "collector", "check", s3_bucket.uri()], env=env,
                           text=True, capture_output=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    second = run_collector(config, s3_bucket.env(), "--in-process")
    assert second.returncode == 0, second.stderr
    assert "12/12 episodes committed; 12 from earlier runs; 0 new" in second.stderr
    with S3RunStore.open(s3_bucket.uri(), _fingerprint(s3_bucket), {}, "arrow", 4) as st:
        assert len(st.committed_ids()) == 12
        ids = [i for entry in st.shards
               for i in st.read_shard(entry, ["episode_id"]).column("episode_id").to_pylist()]
        assert sorted(ids) == sorted(st.committed_ids())  # each once
        assert {e["path"] for e in st.shards} == {k.removeprefix("run/") for k in s3_bucket.keys("run/data/")}
        names = {e["path"].rsplit("/", 1)[-1].split(".")[0] for e in st.shards}
        assert {"worker" if re.fullmatch(r"part-[0-9a-f]{32}", n) else "driver" for n in names} == {writer}
    mirror = tmp_path / "bucket"
    for key in s3_bucket.keys(""):
        target = mirror / key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(s3_bucket.client.get_object(Bucket=s3_bucket.name, Key=key)["Body"].read())
    (mirror / "output.txt").write_text(first.stdout + first.stderr + second.stdout + second.stderr)
    assert any(mirror.rglob("*.arrow"))
    assert leaks_in(mirror, [SECRET_ACCESS_KEY]) == []


def _fingerprint(bucket: S3Bucket) -> str:
    got = bucket.client.get_object(Bucket=bucket.name, Key="run/.collector/config.resolved.json")
    return str(json.loads(got["Body"].read())["fingerprint"])


def test_a_missing_bucket_is_one_line_and_exit_2(tmp_path: Path, s3_bucket: S3Bucket) -> None:
    """`collector run` into a bucket that does not exist: one line naming it and NoSuchBucket, exit 2."""
    config = write_config(tmp_path, "s3://no-such-bucket-for-collector/run")
    proc = run_collector(config, s3_bucket.env())
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "s3://no-such-bucket-for-collector/" in lines[0]
    assert "NoSuchBucket" in lines[0]


def test_a_wrong_secret_key_is_one_line_and_exit_2_without_the_secret(
    tmp_path: Path, s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a wrong secret key the run stops in one line naming the bucket and the S3 code, never the key."""
    import boto3
    import moto.settings

    iam = boto3.client("iam", endpoint_url=s3_bucket.endpoint_url, region_name=REGION)
    iam.create_user(UserName="collector")
    iam.put_user_policy(UserName="collector", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="collector")["AccessKey"]
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # the server checks signatures now
    config = write_config(tmp_path, s3_bucket.uri())
    good = {**s3_bucket.env(), "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", good["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", good["AWS_SECRET_ACCESS_KEY"])
    S3RunStore.open(s3_bucket.uri("control"), "fp", {}).close()  # the right secret is accepted
    wrong = "wrong-secret-7f3a9c1e2b4d6f8a0c2e4a6b8d0f"
    proc = run_collector(config, {**good, "AWS_SECRET_ACCESS_KEY": wrong})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"s3://{s3_bucket.name}/run/" in lines[0]
    assert "SignatureDoesNotMatch" in lines[0]
    assert wrong not in proc.stderr + proc.stdout
    assert key["SecretAccessKey"] not in proc.stderr + proc.stdout


def test_retry_errors_finds_the_error_episodes_of_a_run_in_s3(s3_bucket: S3Bucket) -> None:
    """`--retry-errors` reads stop reasons through the store: the error episodes of an S3 run are found."""
    from collector.run.job import committed_error_ids
    from collector.stop import StopReason
    from tests.record.factory import make_batch

    work = make_batch(6, stops=(StopReason.DONE, StopReason.ERROR))
    with S3RunStore.open(s3_bucket.uri(), "fp", {}, "arrow", 4) as st:
        st.commit(work)
        errors = committed_error_ids(st)
        assert errors == {e.episode_id for e in work if e.stop_reason is StopReason.ERROR}
        assert st.forget(errors) == 3
        assert committed_error_ids(st) == set()


@pytest.mark.parametrize(("path", "says"), [
    ("gs://some-bucket/run", "gs:// is not supported"),
    ("s3://testkey:not-a-real-secret@some-bucket/run", "carries credentials in the URI"),
])
def test_an_unsupported_or_credential_bearing_output_uri_is_one_line_and_exit_2(
    tmp_path: Path, path: str, says: str
) -> None:
    """output.path gs://... or with credentials in it: one line, exit 2, the URI's secret not echoed."""
    proc = run_collector(write_config(tmp_path, path), {})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert says in lines[0]
    assert "not-a-real-secret" not in proc.stderr + proc.stdout
