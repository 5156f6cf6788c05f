"""Which returned episodes stop the run instead of being committed (tests:
tests/faults/test_run_stoppers.py, tests/run/test_worker_credentials.py).

A `QuotaExhausted` episode is never committed (the run did not fail the episode, the
account did): the driver stops handing out work, commits what finished and raises, so a
rerun after the quota resets picks up exactly the missing episodes. A `RequestRejected`
with HTTP 401, 403 or 404 is treated the same way: a refused key or an unknown model name
fails every episode alike, so recording them as `error` rows would fill the run with rows
a rerun (after fixing the config) never retries. Other 4xx stay per-episode errors.

The message names the cause and the config field to fix, never the key.
"""

from __future__ import annotations

import re
from typing import Protocol

from collector.config import RunConfig
from collector.errors import CollectorError, QuotaExhausted, RequestRejected
from collector.providers.http import PATH_MARK
from collector.record.episode import EpisodeError
from collector.run.endpoints import url_credentials

__all__ = ["FATAL_REJECTIONS", "fatal_rejection", "rejection_status", "run_stopper", "stops_run"]

#: Rejections that fail every episode alike (key, permission, model name): fatal for the run.
FATAL_REJECTIONS = frozenset({401, 403, 404})
#: `str(ProviderError)` ends with the status; `EpisodeError` keeps only type and message.
_STATUS_SUFFIX = re.compile(r"\(HTTP (\d{3})\)$")


class Returned(Protocol):
    """What is read of a returned episode: an `Episode`, or a writing worker's `Outcome`."""

    @property
    def provider(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def error(self) -> EpisodeError | None: ...


def rejection_status(error: EpisodeError | None) -> int | None:
    """The HTTP status of a `RequestRejected` episode error, else None."""
    if error is None or error.type != RequestRejected.__name__:
        return None
    match = _STATUS_SUFFIX.search(error.message)
    return int(match.group(1)) if match else None


def stops_run(error: EpisodeError | None) -> bool:
    """Whether an episode's error stops the run instead of being committed."""
    if error is None:
        return False
    return error.type == QuotaExhausted.__name__ or rejection_status(error) in FATAL_REJECTIONS


def run_stopper(episode: Returned, cfg: RunConfig) -> CollectorError | None:
    """The error that ends the run because of this episode (quota, a fatal rejection), else None."""
    error = episode.error
    if error is not None and error.type == QuotaExhausted.__name__:
        return QuotaExhausted(
            f"provider quota exhausted ({error.message}); finished episodes are "
            "committed, run again when the quota resets to resume"
        )
    return fatal_rejection(episode, cfg)


def fatal_rejection(episode: Returned, cfg: RunConfig) -> CollectorError | None:
    """The run-stopping error an episode's `RequestRejected` 401/403/404 stands for, else None.

    The message names the cause and the config field to fix, never the key: for 401/403 it
    names the variable the key came from, for 404 the model name.
    """
    error = episode.error
    status = rejection_status(error)
    if error is None or status not in FATAL_REJECTIONS:
        return None
    providers = cfg.sweep.providers or [cfg.provider]
    provider = next((p for p in providers if p.name == episode.provider), providers[0])
    where = f"provider {provider.name}"
    detail, _, path = error.message.partition(f" {PATH_MARK}")
    if status == 404 and path and episode.model not in detail and "model" not in detail.lower():
        # The server's 404 does not speak of a model: the URL path is what it did not know.
        path = path.split("]", 1)[0]
        message = (
            f"{where}: HTTP 404 for {path}: the URL path is wrong, not the model; check provider.base_url "
            f"({_BASE_URL_CONVENTION.get(provider.wire, 'see the README')})"
        )
    elif status == 404:
        message = (
            f"{where} does not know model {episode.model!r} (HTTP 404); check sweep.models "
            "(finished episodes are committed; rerun after fixing it)"
        )
    else:
        # Name what was sent (one source per provider: `read_api_key`), never its value.
        env = provider.api_key_env
        if env:
            sent, field = f"the key in ${env} was", "provider.api_key_env and the key's permissions"
        elif url_credentials(provider.base_url):
            sent, field = "the credentials from base_url were", "the credentials in provider.base_url"
        else:
            sent, field = "the request (no key configured) was", "provider.api_key_env"
        message = (
            f"{where}: {sent} refused (HTTP {status}); check {field} "
            "(finished episodes are committed; rerun after fixing it)"
        )
    return RequestRejected(message, None)


#: Where `base_url` ends, per wire format: the convention of each official SDK.
_BASE_URL_CONVENTION = {
    "chat": "OpenAI-compatible servers take the version prefix: http://host:8000/v1, https://api.openai.com/v1",
    "responses": "OpenAI-compatible servers take the version prefix: https://api.openai.com/v1",
    "anthropic": "the server root, without /v1: https://api.anthropic.com",
    "gemini": "the server root, without /v1beta: https://generativelanguage.googleapis.com",
}
