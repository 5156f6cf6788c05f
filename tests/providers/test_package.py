"""The package surface: a tested `__all__`, the factory, and the base-URL convention."""

from __future__ import annotations

import httpx
import pytest

import collector.providers as providers
from collector.errors import ConfigError
from collector.providers import PROVIDER_KINDS, base_url_for, build_provider
from collector.providers.base import Endpoint


def test_all_names_exist() -> None:
    """Every name in `collector.providers.__all__` is importable from the package."""
    for name in providers.__all__:
        assert hasattr(providers, name), name


async def test_factory_builds_each_kind() -> None:
    """build_provider returns an adapter whose `kind` is the one asked for, with a `complete` coroutine."""
    async with httpx.AsyncClient() as client:
        for kind in ("chat", "responses", "anthropic", "gemini"):
            adapter = build_provider(kind, Endpoint("http://x"), client)
            assert adapter.kind == kind
            assert callable(adapter.complete)
    assert PROVIDER_KINDS == ("chat", "responses", "anthropic", "gemini")


async def test_factory_rejects_unknown_kind() -> None:
    """An unknown kind is a one-line ConfigError naming the choices."""
    async with httpx.AsyncClient() as client:
        with pytest.raises(ConfigError, match="unknown provider kind 'sim'"):
            build_provider("sim", Endpoint("http://x"), client)


def test_base_url_for_follows_sdk_conventions() -> None:
    """OpenAI families get `/v1` on the server root; Anthropic and Gemini take the root."""
    assert base_url_for("chat", "http://127.0.0.1:8000/") == "http://127.0.0.1:8000/v1"
    assert base_url_for("responses", "http://h") == "http://h/v1"
    assert base_url_for("anthropic", "http://h/") == "http://h"
    assert base_url_for("gemini", "http://h") == "http://h"


def test_endpoint_repr_hides_the_key() -> None:
    """An Endpoint's repr (what a log or traceback would show) never contains the key."""
    assert "sk-hidden" not in repr(Endpoint("http://x", api_key="sk-hidden"))
