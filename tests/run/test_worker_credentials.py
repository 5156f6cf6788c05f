"""Credentials written in `base_url`: sent as the user meant, kept out of every record and message.

Through `EpisodeWorker` (no Ray) against a loopback Chat Completions server that echoes every
credential it received (the `Authorization: Basic` header, the user and password it decodes
to, the query key) into the reply text, a tool call's arguments and a 400 error message.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from collector.config import ProviderConfig
from collector.errors import ConfigError, RequestRejected
from collector.record.episode import Episode, EpisodeError
from collector.run.endpoints import endpoint_for, read_api_key
from collector.run.plan import plan_work
from collector.run.stoppers import fatal_rejection
from collector.run.worker import EpisodeWorker, WorkerSetup
from collector.stop import StopReason
from tests.loopback import serving
from tests.run.helpers import small_config

USER = "bob"
PASSWORD = "pw!PLANTED/url@pass"  # characters that must be percent-encoded in a URL
QUERY_KEY = "AIzaPLANTEDqueryKEY0123"
BASIC = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
FORMS = (PASSWORD, BASIC, QUERY_KEY, f"{USER}:{PASSWORD}", quote(PASSWORD, safe=""))


class Echo:
    """What the server received, and a reply that repeats it all back."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, str]]] = []

    async def handle(self, request: Request) -> JSONResponse:
        body = await request.json()
        authorization = request.headers.get("authorization", "")
        self.seen.append((request.url.path, authorization, dict(request.query_params)))
        decoded = base64.b64decode(authorization.removeprefix("Basic ")).decode(errors="replace")
        echoed = f"you sent {authorization} ({decoded}) with key={request.query_params.get('key')}"
        if len(self.seen) == 1:  # the first request of the run: a rejection echoing it all
            error = {"message": f"Rejected: {echoed}", "type": "invalid_request_error"}
            return JSONResponse({"error": error}, 400)
        if any(m.get("role") == "tool" for m in body["messages"]):
            message: dict[str, Any] = {"role": "assistant", "content": f"42, and {echoed}"}
            finish = "stop"
        else:
            args = {"expression": "6*7", "note": echoed, "login": decoded}
            function = {"name": "calculator", "arguments": json.dumps(args)}
            call = {"id": "c1", "type": "function", "function": function}
            message, finish = {"role": "assistant", "content": echoed, "tool_calls": [call]}, "tool_calls"
        return JSONResponse({
            "id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
        })


@pytest.fixture
def echo_server() -> Iterator[tuple[str, Echo]]:
    """The echoing server on a free loopback port; yields its root URL and its recorder."""
    echo = Echo()
    app = Starlette(routes=[Route("/v1/chat/completions", echo.handle, methods=["POST"])])
    with serving(app) as root:
        yield root, echo


def url_with_credentials(root: str) -> str:
    host = root.removeprefix("http://")
    return f"http://{USER}:{quote(PASSWORD, safe='')}@{host}/v1?key={QUERY_KEY}"


def test_url_credentials_are_sent_as_basic_and_query_and_never_stored(
    tmp_path: Path, echo_server: tuple[str, Echo]
) -> None:
    """user:pass@ is sent as Authorization: Basic, ?key= as a query key; no form of either is stored."""
    root, echo = echo_server
    cfg = small_config(
        tmp_path / "run",
        provider={"kind": "chat", "base_url": url_with_credentials(root)},
        sweep={"models": ["m"], "budgets": [64]},
        env={"name": "arithmetic", "tasks": 3},
        samples_per_task=1,
    )
    plan = plan_work(cfg)
    urls = tuple(p.base_url or "" for p in plan.providers)

    async def run() -> list[Episode]:
        worker = EpisodeWorker(WorkerSetup(cfg, plan.run_id, urls, "w"))
        try:
            return await worker.run_batch(plan.items)
        finally:
            await worker.close()

    episodes = asyncio.run(run())
    # Sent as meant: the path intact, the password decoded into the Basic header, the key a query.
    assert {path for path, _, _ in echo.seen} == {"/v1/chat/completions"}
    assert {auth for _, auth, _ in echo.seen} == {f"Basic {BASIC}"}
    assert all(query == {"key": QUERY_KEY} for _, _, query in echo.seen)
    reasons = sorted(e.stop_reason.value for e in episodes)
    assert reasons == ["done", "done", "error"], reasons
    error = next(e.error for e in episodes if e.error is not None)
    assert error.type == "RequestRejected"
    assert "[redacted]" in error.message
    stored = repr(episodes)
    assert not [form for form in FORMS if form in stored]
    assert "[redacted credential]" in stored  # the echoes were there, and were replaced


def test_endpoint_moves_url_credentials_out_of_the_url() -> None:
    """The endpoint's URL has no user info or query; the Basic pair, query and credential forms are apart."""
    provider = ProviderConfig(kind="chat", base_url="x")
    endpoint = endpoint_for(provider, url_with_credentials("http://h:8000"), None)
    assert endpoint.base_url == "http://h:8000/v1"
    assert endpoint.basic_auth == (USER, PASSWORD)
    assert endpoint.query == (("key", QUERY_KEY),)
    assert set(FORMS) <= set(endpoint.credentials)
    assert USER not in endpoint.credentials  # a user beside a password is not a secret
    assert not [form for form in FORMS if form in repr(endpoint)]


def test_url_credentials_and_a_key_variable_together_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials in base_url plus api_key_env is one ConfigError naming both fields, no value."""
    monkeypatch.setenv("COLLECTOR_TEST_KEY", "sk-PLANTED-env-key")
    for url in (url_with_credentials("http://h:8000"), "http://h:8000/v1?key=AIzaPLANTED"):
        provider = ProviderConfig(kind="chat", base_url=url, api_key_env="COLLECTOR_TEST_KEY")
        with pytest.raises(ConfigError) as caught:
            read_api_key(provider, "here")
        message = str(caught.value)
        assert "provider.base_url holds credentials" in message
        assert "COLLECTOR_TEST_KEY" in message
        assert "PLANTED" not in message
    innocent = ProviderConfig(
        kind="chat", base_url="http://h/v1?api-version=1", api_key_env="COLLECTOR_TEST_KEY"
    )
    assert read_api_key(innocent, "here") == "sk-PLANTED-env-key"


@pytest.mark.parametrize(
    ("provider", "named"),
    [
        ({"kind": "chat", "base_url": url_with_credentials("http://h:1")},
         "the credentials from base_url were"),
        ({"kind": "chat", "base_url": "http://h:1/v1", "api_key_env": "MY_KEY"}, "the key in $MY_KEY was"),
        ({"kind": "chat", "base_url": "http://h:1/v1"}, "the request (no key configured) was"),
    ],
)
def test_refusal_names_what_was_sent_never_its_value(
    tmp_path: Path, provider: dict[str, str], named: str
) -> None:
    """A 401 stops the run with a line naming the credential's source (variable, base_url), never a value."""
    cfg = small_config(tmp_path / "run", provider=provider, sweep={"models": ["m"], "budgets": [64]})
    item = plan_work(cfg).items[0]
    episode = Episode(
        episode_id=item.episode_id, run_id="r", model="m", provider="chat", budget=64, env="arithmetic",
        task_id=item.task_id, sample=0, seed=0, stop_reason=StopReason.ERROR, trainable=False, reward=0.0,
        graded_reward=None, duration_s=0.0, turns=[], messages=[], executed_tool_calls=[], tool_errors=0,
        error=EpisodeError("RequestRejected", "chat: invalid_api_key: Incorrect key [redacted]. (HTTP 401)"),
    )
    stop = fatal_rejection(episode, cfg)
    assert isinstance(stop, RequestRejected)
    assert f"{named} refused (HTTP 401)" in stop.message
    assert PASSWORD not in stop.message
    assert quote(PASSWORD, safe="") not in stop.message


API_KEY = "sk-PLANTED-env-key-0123456789"
ROOTS = {
    "chat": "provider.test/v1", "responses": "provider.test/v1",
    "anthropic": "provider.test", "gemini": "provider.test",
}  # fmt: skip
KEY_HEADER = {
    "chat": "authorization", "responses": "authorization",
    "anthropic": "x-api-key", "gemini": "x-goog-api-key",
}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("source", ["api_key_env", "base_url"])
@pytest.mark.parametrize("kind", ["chat", "responses", "anthropic", "gemini"])
def test_every_credential_form_sent_is_scrubbed_from_error_messages(
    kind: str, source: str, stream: bool
) -> None:
    """Bearer, x-api-key, x-goog-api-key, Basic (base64) and ?key= values echoed back are not in the error."""
    import httpx

    from collector.providers import build_provider
    from tests.providers.conftest import request as turn_request

    seen: list[httpx.Request] = []

    def echo(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        values = [req.headers.get(h, "") for h in ("authorization", "x-api-key", "x-goog-api-key")]
        values.append(req.url.params.get("key", ""))
        message = " | ".join(v for v in values if v)
        return httpx.Response(400, json={"error": {"message": message, "type": "invalid_request_error"}})

    if source == "api_key_env":
        url, key, sent = f"http://{ROOTS[kind]}", API_KEY, {API_KEY}
    else:
        url, key = f"http://{USER}:{quote(PASSWORD, safe='')}@{ROOTS[kind]}?key={QUERY_KEY}", None
        sent = {BASIC, QUERY_KEY}
    endpoint = endpoint_for(ProviderConfig(kind=kind, base_url=url, streaming=stream), url, key)

    async def call() -> str:
        async with httpx.AsyncClient(transport=httpx.MockTransport(echo)) as client:
            provider = build_provider(kind, endpoint, client)
            with pytest.raises(RequestRejected) as caught:
                await provider.complete(turn_request())
            return str(caught.value)

    message = asyncio.run(call())
    assert message.count("[redacted]") == len(sent), message
    assert not [form for form in (*sent, *FORMS) if form in message], message
    (req,) = seen
    if source == "api_key_env":
        expected = f"Bearer {API_KEY}" if KEY_HEADER[kind] == "authorization" else API_KEY
        assert req.headers[KEY_HEADER[kind]] == expected
    else:
        assert req.headers["authorization"] == f"Basic {BASIC}"
        assert req.url.params["key"] == QUERY_KEY
        assert "@" not in str(req.url)
        assert req.url.path.startswith("/v1")
