"""Provider adapters: four wire formats behind one `Provider` interface.

`build_provider(kind, endpoint, client)` returns the adapter for a wire format:

- ``"chat"``       OpenAI Chat Completions (vLLM, SGLang, llama.cpp, gateways);
- ``"responses"``  OpenAI Responses;
- ``"anthropic"``  Anthropic Messages;
- ``"gemini"``     Gemini generateContent / streamGenerateContent.

``"token_in"`` is not a wire of its own: it is token-in mode (`sampling.token_in`) on a chat
server, `collector.providers.tokenin.TokenInProvider`, whose dialect (llama.cpp, vLLM,
SGLang) each request names in `SamplingParams.token_in`.

`Endpoint.base_url` follows each official SDK's convention: the OpenAI families include the
version prefix (``http://host:8000/v1``), Anthropic and Gemini take the server root
(``https://api.anthropic.com``, ``https://generativelanguage.googleapis.com``).
`base_url_for(kind, root)` turns a server root (the simulator's, say) into that form.

Every adapter is handed its `httpx.AsyncClient` and never builds one. The client the
collector hands them is built in `collector.run.worker` (one client per worker, shared by its
episode slots) over `collector.providers.transport.StreamTransport`, whose module docstring
and `collector.run.worker`'s say why that layout holds up under thousands of episodes in flight.

Tests: tests/providers/test_package.py, tests/providers/test_sim.py,
tests/providers/test_tokenin_servers.py.
"""

from __future__ import annotations

import random

import httpx

from collector.errors import ConfigError
from collector.providers.anthropic import AnthropicProvider
from collector.providers.base import Endpoint, Provider, RetryPolicy
from collector.providers.chat import ChatProvider
from collector.providers.gemini import GeminiProvider
from collector.providers.http import Sleep
from collector.providers.responses import ResponsesProvider

__all__ = [
    "PROVIDER_KINDS",
    "AnthropicProvider",
    "ChatProvider",
    "Endpoint",
    "GeminiProvider",
    "Provider",
    "ResponsesProvider",
    "RetryPolicy",
    "base_url_for",
    "build_provider",
]

_ADAPTERS: dict[str, type[ChatProvider | ResponsesProvider | AnthropicProvider | GeminiProvider]] = {
    "chat": ChatProvider,
    "responses": ResponsesProvider,
    "anthropic": AnthropicProvider,
    "gemini": GeminiProvider,
}
PROVIDER_KINDS: tuple[str, ...] = tuple(_ADAPTERS)


def build_provider(
    kind: str,
    endpoint: Endpoint,
    client: httpx.AsyncClient,
    *,
    sleep: Sleep | None = None,
    rng: random.Random | None = None,
) -> Provider:
    """The adapter for wire format `kind`, speaking to `endpoint` over `client`.

    `sleep` (default `asyncio.sleep`) and `rng` drive retry back-off; tests inject both.
    """
    if kind == "token_in":  # token-in mode on a chat server (sampling.token_in), not a wire of its own
        from collector.providers.tokenin import TokenInProvider

        return TokenInProvider(endpoint, client, sleep=sleep, rng=rng)
    try:
        adapter = _ADAPTERS[kind]
    except KeyError:
        raise ConfigError(
            f"unknown provider kind {kind!r}; expected one of {', '.join(PROVIDER_KINDS)}"
        ) from None
    return adapter(endpoint, client, sleep=sleep, rng=rng)


def base_url_for(kind: str, root: str) -> str:
    """The `Endpoint.base_url` for a server root: `root/v1` for the OpenAI families, else `root`."""
    root = root.rstrip("/")
    return root + "/v1" if kind in ("chat", "responses") else root
