"""Where and how a provider is called, and with which credentials: shared by the worker, the
preflight checks and the served-model check (tests: tests/run/test_worker_credentials.py,
tests/run/test_worker.py).

Secrets. The API key is read from the variable the config names, in the environment of the
process that calls (`read_api_key`): it never crosses Ray and never enters a log, an
episode or an error. Messages name URLs through `safe_url` (no user info).
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from collector.config import ProviderConfig
from collector.episode.redact import credential_values
from collector.errors import ConfigError
from collector.providers.base import Endpoint, RetryPolicy, split_url_credentials

__all__ = ["endpoint_for", "read_api_key", "safe_url", "url_credentials"]


def endpoint_for(provider: ProviderConfig, base_url: str, api_key: str | None) -> Endpoint:
    """What and how to call: credentials in `base_url` move out of the URL into the Basic
    header and the query they are sent in, and every credential sent is listed for scrubbing."""
    retry = provider.retry
    url, basic_auth, query = split_url_credentials(base_url)
    return Endpoint(
        base_url=url,
        api_key=api_key,
        basic_auth=basic_auth,
        query=query,
        credentials=credential_values(api_key, basic_auth, query),
        streaming=provider.streaming,
        request_timeout_s=provider.request_timeout_s,
        request_deadline_s=provider.request_deadline_s,
        max_reply_bytes=provider.max_reply_bytes,
        retry=RetryPolicy(
            max_retries=retry.max_retries,
            initial_backoff_s=retry.initial_backoff_s,
            max_backoff_s=retry.max_backoff_s,
            max_retry_after_s=retry.max_retry_after_s,
        ),
        cap_field=provider.cap_field,
    )


def url_credentials(base_url: str | None) -> bool:
    """Whether a base URL carries credentials: user info, or a query key (`?key=`, `?token=`)."""
    if not base_url:
        return False
    _, basic_auth, query = split_url_credentials(base_url)
    return basic_auth is not None or bool(credential_values(None, None, query))


def read_api_key(provider: ProviderConfig, where: str) -> str | None:
    """The key from the variable named in config; a missing variable is a one-line ConfigError.

    A provider takes its credentials from one place: `api_key_env` or the base URL. Both
    would put two credentials on one request (for the OpenAI wires, two `Authorization`
    headers of which one silently wins), so both is refused.
    """
    if provider.api_key_env is None:
        return None
    if provider.kind != "sim" and url_credentials(provider.base_url):
        raise ConfigError(
            f"provider {provider.name}: provider.base_url holds credentials and provider.api_key_env "
            f"({provider.api_key_env}) is set too; give the credentials in one of them"
        )
    value = os.environ.get(provider.api_key_env)
    if not value:
        raise ConfigError(
            f"provider.api_key_env: environment variable {provider.api_key_env} is not set ({where})"
        )
    return value


def safe_url(url: str) -> str:
    """The URL without user info, for messages (a `user:pass@` must never be printed)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port that is not a number in range: shown as written
        port = ":" + parts.netloc.rpartition("@")[2].rpartition(":")[2]
    return f"{parts.scheme}://{host}{port}{parts.path}"
