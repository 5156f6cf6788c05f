"""What reaches a tracker holds no secret the record would scrub: the last check before it leaves.

Part of `collector.tracking` (tests: tests/tracking/test_scrub.py, and the planted-secret
scan of a W&B offline run and an MLflow store in tests/system/tracking/test_end_to_end.py).

What a tracker is handed is built from what is already safe: the resolved config (the key's
variable name, never its value; URLs without user info or query, `resolved_config`) and the
committed shards (credentials and secret-keyed arguments already replaced by the episode
loop's redaction). A tracker's payload leaves the machine, though, and its SDK may keep a
copy anywhere (W&B's offline files, its artifact staging, MLflow's store), so every string
of every payload is scrubbed once more, here, of the run's own credentials in every form
they are sent in: each provider's API key (read from its `api_key_env`, as the workers read
it), the credentials in each base URL, in an MCP server's URL and in the MLflow tracking URI
(`collector.config.url_credentials`: user info, `user:pass`, its base64, credential query
values, encoded and not). Same marker as the record's (`[redacted credential]`).

A tracker's SDK also finds URLs of its own, outside the config: `MLFLOW_TRACKING_URI` and
`WANDB_BASE_URL` from the environment, a proxy from `HTTPS_PROXY`, a server's redirect. Their
credentials are collected from the environment like the config's (`TRACKER_URL_VARIABLES`),
and every string is then cleared of whatever URL credentials remain, known or not: the user
info of any `scheme://user:pass@host` and the value of any credential query parameter
(`?token=...`, `&key=...`), so a URL no list foresaw is printed without its secret too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from collector.config import RunConfig, url_credentials
from collector.config.urls import secret_query_name

__all__ = ["MARKER", "TRACKER_URL_VARIABLES", "Scrubber", "run_credentials", "scrub_url_credentials"]

MARKER = "[redacted credential]"
#: Shorter values are not treated as secrets: a 1-3 character "key" would blank every word
#: that contains it (the record's redactor keeps the same floor).
MIN_SECRET = 4
#: Environment variables the trackers' SDKs (and the HTTP stack under them) read a URL from.
TRACKER_URL_VARIABLES = (
    "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "WANDB_BASE_URL",
    "HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy",
)  # fmt: skip

# `scheme://userinfo@`: the user info of a URL anywhere in a string (no space, slash or @ in it).
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/@?#]+)@")
# `?name=value` or `&name=value` in a URL: the value is hidden when the name is a credential's.
_URL_QUERY_PAIR = re.compile(r"(?P<lead>[?&;](?P<name>[^=&\s#?;]+)=)(?P<value>[^&\s#;'\"<>)]+)")


def _userinfo(match: re.Match[str]) -> str:
    user, colon, _ = match["userinfo"].partition(":")
    # A user name beside a password is not a secret (as `url_credentials` keeps it); a lone
    # user part may be a token (`https://TOKEN@host`), so it goes.
    return f"{match['scheme']}{user}:{MARKER}@" if colon else f"{match['scheme']}{MARKER}@"


def _query_pair(match: re.Match[str]) -> str:
    return f"{match['lead']}{MARKER}" if secret_query_name(match["name"]) else match.group()


def scrub_url_credentials(text: str) -> str:
    """`text` with the credentials of every URL in it replaced: user info and credential query values."""
    if "@" in text:
        text = _URL_USERINFO.sub(_userinfo, text)
    if "=" in text:
        text = _URL_QUERY_PAIR.sub(_query_pair, text)
    return text


def run_credentials(cfg: RunConfig, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """Every credential value the run holds, in every form it may be written."""
    env = os.environ if environ is None else environ
    found: list[str] = []
    for provider in cfg.sweep.providers or [cfg.provider]:
        if provider.api_key_env and env.get(provider.api_key_env):
            found.append(env[provider.api_key_env])
        if provider.base_url:
            found += url_credentials(provider.base_url)
    server = cfg.env.options.get("server")
    if isinstance(server, str) and "://" in server:
        found += url_credentials(server)
    mlflow = cfg.tracking.mlflow
    if mlflow is not None and mlflow.tracking_uri:
        found += url_credentials(mlflow.tracking_uri)
    for variable in TRACKER_URL_VARIABLES:
        if env.get(variable):
            found += url_credentials(env[variable])
    for variable in ("WANDB_API_KEY", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        if env.get(variable):
            found.append(env[variable])  # the trackers' own keys: never a payload either
    return tuple(dict.fromkeys(v for v in found if len(v) >= MIN_SECRET))


class Scrubber:
    """Replaces every known secret in every string of a payload (dict keys too), at any depth."""

    def __init__(self, secrets: Iterable[str]) -> None:
        # Longest first: a secret that contains another is replaced whole.
        self.secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET}, key=len, reverse=True)

    def text(self, value: str) -> str:
        for secret in self.secrets:
            if secret in value:
                value = value.replace(secret, MARKER)
        return scrub_url_credentials(value)

    def value(self, value: Any) -> Any:
        """`value` with every string scrubbed (dicts, lists and tuples rebuilt, other values kept)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.value(k): self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value
