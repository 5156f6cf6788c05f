"""Before the sweep: the model that answers is the model asked for, or the run does not start.

llama-server answers *any* model name with its own alias, so a typo in `sweep.models`, or a
two-model sweep pointed at one server, would silently collect one model under two names.
Each (provider, model) is checked once, before any episode runs:

1. `GET {base_url}/models` (OpenAI-compatible servers: llama.cpp, vLLM, SGLang, OpenAI,
   gateways): when it lists model ids, the asked name must be one of them;
2. otherwise (no such endpoint, Anthropic, Gemini) one small model call (a 16-token cap,
   no tools): the reply's own `model` (Gemini `modelVersion`) must name the asked model.

A mismatch is one line naming the provider, the asked and the served name, and the escape:
`provider.allow_model_alias = true` for a server that aliases on purpose (then the reply's
model is still recorded per turn, `turns.response_model`). A hosted API that answers with a
dated snapshot of the asked name passes (`gpt-4o` -> `gpt-4o-2024-08-06`, `claude-x-latest`
-> `claude-x-20250929`, `gemini-1.5-flash` -> `gemini-1.5-flash-002`, Ollama's `:latest`).
Whatever else goes wrong here (a 401, a 5xx, a request timing out) is left to the episodes
and the existing checks: this module refuses only on evidence of another model.

Bounded. httpx's timeouts apply between reads, so a server trickling its `/models` answer a
byte at a time would hold `collector run` forever: each provider's check (its listing, or
its probe call) has a total deadline of `DEADLINE_S`, and a listing is read up to
`MAX_LIST_BYTES` (larger: no usable list, the probe call decides). A check that misses its
deadline stops the run in one line, before any work, naming the provider and the escape
(`provider.allow_model_alias = true` skips the check): a server that cannot answer a model
list in that time would not serve a sweep either, and skipping silently would drop the
check exactly where a misconfigured endpoint is likely. Tests: tests/run/test_modelcheck.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any

import httpx

from collector.config import ProviderConfig, public_url
from collector.errors import ConfigError, ProviderError
from collector.providers.base import RetryPolicy, basic_authorization, split_url_credentials
from collector.run.endpoints import endpoint_for, read_api_key
from collector.turn import TurnRequest, UserMessage

__all__ = ["check_models", "served_as"]

#: A snapshot suffix after `{asked}-`: a date (2024-08-06, 20241022) or a version (002, 0125).
_SNAPSHOT = re.compile(r"^(?:\d{4}-\d{2}-\d{2}|\d{8}|\d{3,4})$")
#: The cap of the one probe call where no model list is served.
PROBE_TOKENS = 16
_TIMEOUT_S = 30.0
#: The whole check of one provider (listing or probe call, every byte of the answer) ends by then.
DEADLINE_S = 60.0
#: A model list is read up to this size (hosted gateways list a few hundred models in well under 1 MB).
MAX_LIST_BYTES = 8 * 1024 * 1024


def _norm(name: str) -> str:
    name = name.strip().lower()
    return name.removeprefix("models/")  # Gemini names models as `models/gemini-...`


def served_as(asked: str, answered: str) -> bool:
    """True when a reply or listing naming `answered` is the model `asked` for."""
    a, b = _norm(asked), _norm(answered)
    if a == b or b == f"{a}:latest":
        return True
    base = a.removesuffix("-latest")
    return b.startswith(base + "-") and bool(_SNAPSHOT.match(b[len(base) + 1 :]))


async def _listed(client: httpx.AsyncClient, provider: ProviderConfig, base_url: str,
                  api_key: str | None) -> list[str] | None:
    """The ids `GET {base_url}/models` lists, or None when the server offers no usable list."""
    if provider.wire not in ("chat", "responses"):
        return None  # Anthropic and Gemini list models in other shapes and with other names
    # Credentials written in base_url go where the requests send them (Basic, the query).
    url, basic_auth, query = split_url_credentials(base_url)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    if basic_auth is not None and not api_key:
        headers["authorization"] = basic_authorization(*basic_auth)
    try:
        async with client.stream("GET", url.rstrip("/") + "/models", headers=headers, params=query,
                                 timeout=_TIMEOUT_S) as response:
            if response.status_code != 200:
                return None
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_LIST_BYTES:
                    return None
        payload: Any = json.loads(bytes(body))
    except (httpx.HTTPError, ValueError):
        return None
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return None
    ids = [item["id"] for item in data if isinstance(item, dict) and isinstance(item.get("id"), str)]
    return ids or None


async def _answered(client: httpx.AsyncClient, provider: ProviderConfig, base_url: str,
                    api_key: str | None, model: str) -> str | None:
    """The model one small call's reply names, or None when the call fails or names none."""
    from collector.providers import build_provider

    endpoint = dataclasses.replace(endpoint_for(provider, base_url, api_key), streaming=False,
                                   request_timeout_s=_TIMEOUT_S, retry=RetryPolicy(max_retries=1))
    request = TurnRequest(model, [UserMessage("Reply with the word OK.")], [], PROBE_TOKENS)
    try:
        turn = await build_provider(provider.wire, endpoint, client).complete(request)
    except ProviderError:
        return None  # a 404, a refused key...: the episodes and the run stoppers say so
    return turn.response_model


def _refusal(provider: ProviderConfig, base_url: str, index: int, model: str, served: str) -> ConfigError:
    return ConfigError(
        f"sweep.models.{index}: provider {provider.name} at {public_url(base_url)} serves {served}, "
        f"not {model!r}; fix the name, or set provider.allow_model_alias = true for a server that "
        "answers every name with its own alias (the reply's model is recorded per turn)"
    )


async def check_models(providers: Sequence[ProviderConfig], base_urls: Sequence[str], models: Sequence[str],
                       where: str) -> None:
    """Refuse (one-line ConfigError) when a provider serves another model than a swept name.

    Providers of kind "sim" and those with `allow_model_alias` are not checked. Keys are read
    here, `where` saying where for a missing variable (`collector.run.endpoints.read_api_key`).
    """
    async with httpx.AsyncClient(trust_env=True) as client:
        for provider, base_url in zip(providers, base_urls, strict=True):
            if provider.kind == "sim" or provider.allow_model_alias:
                continue
            key = read_api_key(provider, where)
            deadline = asyncio.timeout(DEADLINE_S)
            try:
                async with deadline:
                    await _check_one(client, provider, base_url, key, models)
            except TimeoutError:
                if not deadline.expired():
                    raise  # not ours: a timeout raised inside, reported as it is
                raise ConfigError(
                    f"provider {provider.name} at {public_url(base_url)}: the served-model check (GET "
                    f"/models, else one small call) got no complete answer within {DEADLINE_S:g}s; check "
                    "the server, or set provider.allow_model_alias = true to skip the check"
                ) from None


async def _check_one(client: httpx.AsyncClient, provider: ProviderConfig, base_url: str, key: str | None,
                     models: Sequence[str]) -> None:
    listed = await _listed(client, provider, base_url, key)
    for index, model in enumerate(models):
        if listed is not None:
            if not any(served_as(model, served) for served in listed):
                shown = ", ".join(repr(s) for s in listed[:3]) + (" ..." if len(listed) > 3 else "")
                raise _refusal(provider, base_url, index, model, shown)
            continue
        answered = await _answered(client, provider, base_url, key, model)
        if answered is not None and not served_as(model, answered):
            raise _refusal(provider, base_url, index, model, repr(answered))
