"""Secrets planted in a run appear in no shard, no log line and no error message.

A fake Chat Completions server (loopback) demands the planted API key, answers one task
with a 401 whose message echoes the key (as OpenAI does, masked or not), and answers the
others with a `login` call whose arguments carry a password and an API token. The run goes
through `collector run` in a subprocess with its own embedded Ray cluster (so the workers
inherit the key variable, as on a real node) whose temp dir is the test's: afterwards every
byte of the run directory, of Ray's log files and of the driver's output is searched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from collector.data.manifest import RESOLVED_CONFIG
from tests.checking import assert_run_checked, committed_rows
from tests.loopback import serving

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
API_KEY = "sk-proj-PLANTEDkey0123456789abcdefXYZ"
PASSWORD = "hunter2-PLANTED-password-77"
TOKEN = "tok-PLANTED-bearer-5c1e9a"
SECRETS = (API_KEY, PASSWORD, TOKEN, "PLANTEDkey", "PLANTED-password", "PLANTED-bearer")


def _reply(message: dict[str, object], finish: str) -> dict[str, object]:
    return {
        "id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": "fake",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 12, "total_tokens": 22},
    }


async def completions(request: Request) -> JSONResponse:
    body = await request.json()
    if request.headers.get("authorization") != f"Bearer {API_KEY}":
        return JSONResponse({"error": {"message": "no key", "type": "invalid_request_error"}}, 401)
    prompt = json.dumps(body["messages"])
    if "task 0" in prompt:
        # A per-request rejection (400) that echoes the key: an `error` row, its message
        # scrubbed. (A 401 would stop the whole run: tests/faults/test_run_stoppers.py.)
        message = f"Request rejected for API key {API_KEY}: unsupported parameter."
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error",
                                       "code": "invalid_request_error"}}, 400)
    if any(m.get("role") == "tool" for m in body["messages"]):
        return JSONResponse(_reply({"role": "assistant", "content": "done"}, "stop"))
    args = {"username": "bob", "password": PASSWORD, "api_token": TOKEN}
    call = {"id": "call_1", "type": "function", "function": {"name": "login", "arguments": json.dumps(args)}}
    return JSONResponse(_reply({"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"))


@pytest.fixture
def fake_provider() -> Iterator[str]:
    """The fake server on a free loopback port; yields its /v1 base URL."""
    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    with serving(app) as root:
        yield root + "/v1"


CONFIG = """
name = "secrets"
[provider]
kind = "chat"
base_url = "{base_url}"
api_key_env = "COLLECTOR_FAULTS_PLANTED_KEY"
retry = {{ max_retries = 1, initial_backoff_s = 0.01, max_backoff_s = 0.02 }}
[sweep]
models = ["fake"]
budgets = [128]
[env]
name = "tests.faults.secret_env:SecretEnv"
python_path = ["{repo}"]
[ray]
workers = 1
episodes_in_flight = 4
cpus_per_worker = 0.5
[output]
path = "{run_dir}"
"""


def leaks_in(root: Path) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found += [f"{path}: {s}" for s in SECRETS if s.encode() in data]
    return found


def test_planted_secrets_reach_no_shard_log_or_message(tmp_path: Path, fake_provider: str) -> None:
    """The API key and credential arguments are absent from shards, manifest, Ray logs and CLI output."""
    run_dir = tmp_path / "run"
    config = tmp_path / "secrets.toml"
    config.write_text(CONFIG.format(base_url=fake_provider, repo=REPO, run_dir=run_dir))
    ray_tmp = tempfile.mkdtemp(prefix="rays", dir="/tmp")  # Ray's socket paths must stay short
    env = {**os.environ, "COLLECTOR_FAULTS_PLANTED_KEY": API_KEY, "RAY_TMPDIR": ray_tmp,
           "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ""}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "collector.cli", "run", str(config)],
            capture_output=True, env=env, cwd=REPO, timeout=200,
        )
        output = proc.stdout.decode() + proc.stderr.decode()
        assert proc.returncode == 0, output[-3000:]
        rows = committed_rows(run_dir)
        assert len(rows) == 4
        reasons = sorted(str(r["stop_reason"]) for r in rows)
        assert reasons == ["done", "done", "done", "error"], reasons
        # The credentials did reach the tool (the login succeeded) but not the record.
        assert all(r["reward"] == 1.0 for r in rows if r["stop_reason"] == "done")
        error = next(r["error"] for r in rows if r["stop_reason"] == "error")
        assert error["type"] == "RequestRejected"
        assert "[redacted]" in error["message"]
        assert_run_checked(run_dir, allow_notes=False)

        assert not [s for s in SECRETS if s in output], output[-3000:]
        assert not leaks_in(run_dir)
        logs = list(Path(ray_tmp).rglob("*.out")) + list(Path(ray_tmp).rglob("*.err"))
        assert logs, "no Ray log files were found to search"
        assert not leaks_in(Path(ray_tmp))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_credentials_in_base_url_are_not_saved(tmp_path: Path) -> None:
    """User info and query string of a base_url (credentials) never reach config.resolved.json."""
    from collector.config import RunConfig, config_fingerprint, resolved_config
    from collector.data.store import RunStore

    cfg = RunConfig.model_validate({
        "name": "urls",
        "provider": {"kind": "chat", "base_url": f"https://bob:{PASSWORD}@gw.example:8443/v1?key={API_KEY}"},
        "sweep": {
            "models": ["m"], "budgets": [16],
            "providers": [
                {"kind": "anthropic", "base_url": f"https://{TOKEN}@api.example/x?token={TOKEN}#f",
                 "label": "a"},
                {"kind": "chat", "base_url": "http://127.0.0.1:8000/v1", "label": "b"},
            ],
        },
        "output": {"path": str(tmp_path / "run")},
    })
    with RunStore.open(tmp_path / "run", config_fingerprint(cfg), resolved_config(cfg)):
        pass
    assert not leaks_in(tmp_path / "run")
    saved = json.loads((tmp_path / "run" / RESOLVED_CONFIG).read_text())["config"]
    assert saved["provider"]["base_url"] == "https://gw.example:8443/v1"
    urls = [p["base_url"] for p in saved["sweep"]["providers"]]
    assert urls == ["https://api.example/x", "http://127.0.0.1:8000/v1"]
