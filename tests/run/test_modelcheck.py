"""The model that answers is the model recorded: a server serving another model is refused before
any work, with one line and an escape; a hosted API's dated snapshot of the asked name passes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from collector.cli import main
from collector.config import ProviderConfig
from collector.errors import ConfigError
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
