"""The model that answers is the model recorded: a server serving another model is refused before
any work, with one line and an escape; a hosted API's dated snapshot of the asked name passes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from collector.cli import main
from collector.config import ProviderConfig
from collector.errors import ConfigError
from collector.run import modelcheck
from collector.run.modelcheck import check_models, served_as
from tests.loopback import serving
from tests.run.aliasing import aliasing_app
from tests.run.test_cli import assert_one_line_error

CONFIG = """
name = "alias"
[provider]
kind = "chat"
base_url = "{url}/v1"
cap_field = "max_tokens"
[sweep]
models = {models}
budgets = [64]
[env]
name = "arithmetic"
tasks = 2
[ray]
workers = 1
cpus_per_worker = 0.5
[output]
path = "{run}"
"""


def _config(tmp_path: Path, url: str, models: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.format(url=url, models=models, run=tmp_path / "run"))
    return path


@pytest.mark.parametrize(("models", "index", "asked"), [('["gemma3-27om"]', 0, "gemma3-27om"),
                                                         ('["gemma3-270m", "qwen3-0.6b"]', 1, "qwen3-0.6b")])
def test_a_name_the_server_does_not_serve_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], models: str, index: int, asked: str
) -> None:
    """A typo, or a second model pointed at the same llama-server, exits 2 with one line; nothing is run."""
    with serving(aliasing_app("gemma3-270m")) as url:
        code = main(["run", str(_config(tmp_path, url, models)), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert_one_line_error(err, f"sweep.models.{index}", repr(asked), "'gemma3-270m'", "allow_model_alias")
    assert not (tmp_path / "run" / "manifest.json").exists()


def _check(url: str, models: list[str], **provider: object) -> None:
    config = ProviderConfig(kind="chat", base_url=f"{url}/v1", **provider)  # type: ignore[arg-type]
    asyncio.run(check_models([config], [f"{url}/v1"], models, "in a test"))


def test_without_a_model_list_the_first_reply_decides() -> None:
    """With no /models, one small call's reply names the model: a dated snapshot passes, another model not."""
    with serving(aliasing_app("gpt-4o-2024-08-06", list_models=False)) as url:
        _check(url, ["gpt-4o"])
        with pytest.raises(ConfigError, match=r"serves 'gpt-4o-2024-08-06', not 'gpt-4\.1'"):
            _check(url, ["gpt-4o", "gpt-4.1"])
        _check(url, ["gpt-4.1"], allow_model_alias=True)  # the documented escape


def test_snapshot_names_pass_and_others_do_not() -> None:
    """Hosted APIs answer with a dated snapshot of the asked name; anything else is another model."""
    assert served_as("gpt-4o", "gpt-4o-2024-08-06")
    assert served_as("claude-sonnet-4-5", "claude-sonnet-4-5-20250929")
    assert served_as("claude-3-5-sonnet-latest", "claude-3-5-sonnet-20241022")
    assert served_as("gemini-1.5-flash", "models/gemini-1.5-flash-002")
    assert served_as("llama3", "llama3:latest")
    assert not served_as("gpt-4o", "gpt-4o-mini")
    assert not served_as("gpt-4o", "gpt-4o-mini-2024-07-18")
    assert not served_as("gemma3-27om", "gemma3-270m")


def trickling_app(alias: str, flood: bool = False) -> Starlette:
    """`/v1/models` that never finishes: one byte every 0.2 s (each read within httpx's timeout),
    or with `flood` an endless stream of spaces as fast as it goes; chat answers as `alias`."""
    inner = aliasing_app(alias, list_models=False)

    async def models(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            yield b'{"object": "list", "data": ['
            while True:
                if flood:
                    yield b" " * 65536
                    await asyncio.sleep(0)
                else:
                    yield b" "
                    await asyncio.sleep(0.2)

        return StreamingResponse(body(), media_type="application/json")

    return Starlette(routes=[Route("/v1/models", models, methods=["GET"]), *inner.routes[1:]])


@pytest.mark.timeout(60)
def test_a_model_list_that_trickles_stops_the_run_at_the_deadline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `/models` answer trickling a byte at a time (never a read timeout) ends `collector run`
    at the check's total deadline, in one line naming the provider and the escape; nothing runs."""
    monkeypatch.setattr(modelcheck, "DEADLINE_S", 2.0)
    with serving(trickling_app("gemma3-270m")) as url:
        started = time.monotonic()
        code = main(["run", str(_config(tmp_path, url, '["gemma3-270m"]')), "--quiet"])
        took = time.monotonic() - started
    assert code == 2
    assert_one_line_error(capsys.readouterr().err, "served-model check", "within 2s", "allow_model_alias")
    assert took < 30  # the deadline, not the guard, ended it
    assert not (tmp_path / "run" / "manifest.json").exists()


@pytest.mark.timeout(60)
def test_a_model_list_past_the_size_cap_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """An endless `/models` body is read up to `MAX_LIST_BYTES` only: no usable list, so the small
    call decides (here: another model is served), well before the deadline."""
    monkeypatch.setattr(modelcheck, "MAX_LIST_BYTES", 1024 * 1024)
    with (serving(trickling_app("gemma3-270m", flood=True)) as url,
          pytest.raises(ConfigError, match=r"serves 'gemma3-270m', not 'qwen3-0\.6b'")):
        _check(url, ["qwen3-0.6b"])
