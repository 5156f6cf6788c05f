"""Secrets planted in a run appear in no shard, no log line, no error message and no token id.

A fake Chat Completions server (loopback) is swept as three providers, each holding its
credential in another form: a key from `api_key_env` (sent as `Authorization: Bearer`),
`user:pass@` in the base URL (sent as `Authorization: Basic <base64>`) and `?key=` in the
base URL's query. It refuses a request without the credential its provider holds; it
answers task 0 with a 400 whose message echoes every credential it received, and tasks 1-3
with a reply echoing them in the text, under an innocent argument key and in the final
answer, plus a `login` call (a password and an API token) and a `configure` call with a value
under each widened secret-key name (`secret_env.WIDENED`). The run asks for token ids, and the
server returns them (vLLM's wire) from the simulator's tokenizer (`secret_scan.SimTokenizer`),
so every stored id decodes back to the text it stands for. Tasks 4-8 plant what only one
scrub of the record sees, each of which must withhold the episode's ids: the provider's own
credential echoed bare in prose (4), a secret pair in the reasoning text (5), the credential
in a tool result (6: `echo_note` repeats what the model passed), the environment's secret
under a secret key in a tool result (7); task 8 plants nothing and keeps its ids. The run
goes through `collector run` in a subprocess with its own embedded Ray cluster (so the
workers inherit the key variable, as on a real node) whose temp dir is the test's, then
through `collector trainer-view`. Afterwards every file of the run directory, the trainer
view and Ray's temp dir is searched *decoded* (`secret_scan`: every column of every shard,
nested values included, every token-id list decoded to text; every JSON string), and so is
the commands' output.
"""

from __future__ import annotations

import base64
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from collector.storage.manifest import RESOLVED_CONFIG
from tests.faults.secret_env import ENV_SECRET, WIDENED
from tests.faults.secret_scan import SimTokenizer, leaks_in, strings_in
from tests.loopback import serving

REPO = Path(__file__).resolve().parents[2]
KEY_VARIABLE = "COLLECTOR_FAULTS_SECRET_KEY"
API_KEY = "sk-proj-PLANTEDkey0123456789abcdefXYZ"
URL_USER = "svc-user"
URL_PASSWORD = "PLANTED-url/pass@word!"  # needs percent-encoding in a URL
BASIC = base64.b64encode(f"{URL_USER}:{URL_PASSWORD}".encode()).decode()
QUERY_KEY = "AIzaPLANTEDqueryKey0123456789"
PASSWORD = "hunter2-PLANTED-password-77"
TOKEN = "tok-PLANTED-bearer-5c1e9a"
REASONING_SECRET = "PLANTED-reasoning-k3y"
#: Every secret contains "PLANTED" except the base64 form, so a partial echo (OpenAI masks
#: keys as `sk-proj-PLANT****XYZ`) of any of them is caught too.
SECRETS = (
    API_KEY, URL_PASSWORD, BASIC, QUERY_KEY, PASSWORD, TOKEN, quote(URL_PASSWORD, safe=""),
    *(v for v in strings_in(WIDENED) if "PLANTED" in v), REASONING_SECRET, ENV_SECRET, "PLANTED",
)  # fmt: skip

#: The server encodes with it and the scans decode with it (the server runs in this process).
TOKENIZER = SimTokenizer()

#: Tasks whose every turn must keep no token id, and the one that plants nothing.
WITHHELD_TASKS = range(1, 8)
CLEAN_TASK = 8


def _reply(body: dict[str, Any], message: dict[str, Any], finish: str) -> dict[str, object]:
    """The `chat.completion`, with the token ids a vLLM server returns when asked for them:
    the prompt as the simulated template renders it, and the output (reasoning, text, calls)."""
    tools = [t["function"]["name"] for t in body.get("tools") or ()]
    prompt_ids = TOKENIZER.render_prompt(body["messages"], tools)
    output_ids = TOKENIZER.encode(message.get("reasoning_content") or "") + TOKENIZER.encode(
        message.get("content") or "")
    for c in message.get("tool_calls") or ():
        output_ids += TOKENIZER.output(c["function"]["name"], c["function"]["arguments"])
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
    reply: dict[str, Any] = {
        "id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": "fake", "choices": [choice],
        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(output_ids),
                  "total_tokens": len(prompt_ids) + len(output_ids)},
    }
    if body.get("return_token_ids"):
        reply["prompt_token_ids"] = prompt_ids
        choice["token_ids"] = output_ids
    return reply


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


async def completions(request: Request) -> JSONResponse:
    body = await request.json()
    authorization = request.headers.get("authorization", "")
    query_key = request.query_params.get("key", "")
    if authorization not in (f"Bearer {API_KEY}", f"Basic {BASIC}") and query_key != QUERY_KEY:
        return JSONResponse({"error": {"message": "no credentials", "type": "invalid_request_error"}}, 401)
    basic = authorization.startswith("Basic ")
    decoded = base64.b64decode(authorization.removeprefix("Basic ")).decode() if basic else ""
    received = f"[{authorization}] [{decoded}] [key={query_key}]"
    # The credential this provider holds, bare: what a model echoing its key would write.
    bare = decoded if basic else authorization.removeprefix("Bearer ") if authorization else query_key
    task = re.search(r"for task (\d+)", json.dumps(body["messages"]))
    assert task is not None, body["messages"]
    number = int(task.group(1))
    answered = any(m.get("role") == "tool" for m in body["messages"])
    if number == 0:
        # A per-request rejection (400) that echoes what was sent: an `error` row, its message
        # scrubbed. (A 401 would stop the whole run: tests/faults/test_run_stoppers.py.)
        message = f"Request rejected for credentials {received}: unsupported parameter."
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error",
                                       "code": "invalid_request_error"}}, 400)
    if answered or number == CLEAN_TASK:
        final = f"done (I was sent {received})" if number < 4 else "done"
        return JSONResponse(_reply(body, {"role": "assistant", "content": final}, "stop"))
    if number == 4:  # the key in prose, no key name beside it: only the credential scrub sees it
        echo = {"role": "assistant", "content": f"Here is the key you gave me: {bare}"}
        return JSONResponse(_reply(body, echo, "stop"))
    if number == 5:  # a secret pair in the thinking only
        thought = {"role": "assistant", "content": "done",
                   "reasoning_content": f"I will sign in with api_key={REASONING_SECRET} first."}
        return JSONResponse(_reply(body, thought, "stop"))
    if number in (6, 7):  # a tool result holding the credential (6) or the environment's secret (7)
        call = _call("call_1", "echo_note", {"note": bare}) if number == 6 else _call(
            "call_1", "read_settings", {})
        return JSONResponse(_reply(body, {"role": "assistant", "content": "", "tool_calls": [call]},
                                   "tool_calls"))
    calls = [
        _call("call_1", "login", {"username": "bob", "password": PASSWORD, "api_token": TOKEN}),
        _call("call_2", "configure", {"settings": {**WIDENED, "note": received}}),
    ]
    text = f"Logging in with what you sent me: {received}"
    message = {"role": "assistant", "content": text, "tool_calls": calls}
    return JSONResponse(_reply(body, message, "tool_calls"))


@pytest.fixture
def fake_provider() -> Iterator[str]:
    """The fake server on a free loopback port; yields its root URL."""
    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    with serving(app) as root:
        yield root


CONFIG = """
name = "secrets"
[sweep]
models = ["fake"]
budgets = [1024]
[sampling]
token_ids = true
[[sweep.providers]]
kind = "chat"
label = "env-key"
base_url = "{root}/v1"
api_key_env = "{key_variable}"
retry = {{ max_retries = 1, initial_backoff_s = 0.01, max_backoff_s = 0.02 }}
[[sweep.providers]]
kind = "chat"
label = "url-user-pass"
base_url = "http://{user}:{password}@{host}/v1"
retry = {{ max_retries = 1, initial_backoff_s = 0.01, max_backoff_s = 0.02 }}
[[sweep.providers]]
kind = "chat"
label = "query-key"
base_url = "{root}/v1?key={query_key}"
retry = {{ max_retries = 1, initial_backoff_s = 0.01, max_backoff_s = 0.02 }}
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


def write_config(path: Path, root: str, run_dir: Path) -> Path:
    path.write_text(CONFIG.format(
        root=root, host=root.removeprefix("http://"), key_variable=KEY_VARIABLE, user=URL_USER,
        password=quote(URL_PASSWORD, safe=""), query_key=QUERY_KEY, repo=REPO, run_dir=run_dir,
    ))
    return path


def test_the_scan_finds_a_secret_inside_compressed_shards_and_json(tmp_path: Path) -> None:
    """A secret nested in a zstd Arrow or Parquet shard, or JSON-escaped, evades a byte grep, not the scan."""
    secret = "PLANTED-nested-Ø-secret"
    rng = random.Random(0)
    words = "the model called a tool to refund the order and then replied with the number".split()  # noqa: SIM905

    def prose() -> str:
        return " ".join(rng.choice(words) for _ in range(200))

    # Shard-like rows: transcripts of prose (zstd then Huffman-codes the literals, so no
    # string survives as bytes), the secret inside one nested tool-call argument.
    rows = [
        {"messages": [{"role": "assistant", "text": prose(),
                       "tool_calls": [{"arguments_json": prose() + (secret if i == 3 else "") + prose()}]}]}
        for i in range(30)
    ]
    table = pa.Table.from_pylist(rows)
    arrow = tmp_path / "model=m" / "part-0.arrow"
    arrow.parent.mkdir()
    options = ipc.IpcWriteOptions(compression="zstd")
    with pa.OSFile(str(arrow), "wb") as sink, ipc.new_file(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    parquet = tmp_path / "part-1.parquet.tmp"  # recognised by its magic bytes, not its name
    pq.write_table(table, str(parquet), compression="zstd")
    notes = tmp_path / "notes.json"
    notes.write_text(json.dumps({"note": secret}))  # "Ø" is written as \u00d8
    for path in (arrow, parquet, notes):
        assert secret.encode() not in path.read_bytes(), path  # what the old byte grep searched
    found = leaks_in(tmp_path, [secret])
    assert sorted(found) == sorted([
        f"{arrow} (arrow): {secret}", f"{notes} (json): {secret}", f"{parquet} (parquet): {secret}",
    ])


def test_credentials_in_base_url_are_not_saved(tmp_path: Path) -> None:
    """User info and query string of a base_url (credentials) never reach config.resolved.json."""
    from collector.config import RunConfig, config_fingerprint, resolved_config
    from collector.storage.local import LocalRunStore

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
    with LocalRunStore.open(tmp_path / "run", config_fingerprint(cfg), resolved_config(cfg)):
        pass
    assert not leaks_in(tmp_path / "run", SECRETS)
    saved = json.loads((tmp_path / "run" / RESOLVED_CONFIG).read_text())["config"]
    assert saved["provider"]["base_url"] == "https://gw.example:8443/v1"
    urls = [p["base_url"] for p in saved["sweep"]["providers"]]
    assert urls == ["https://api.example/x", "http://127.0.0.1:8000/v1"]
