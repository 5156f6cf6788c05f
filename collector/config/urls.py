"""Credentials written into URLs: the public form stored or printed, and the secret values.

Part of `collector.config` (import from there). Tests: tests/test_config.py,
tests/system/envs/test_mcp.py (an MCP server's URL).

A URL may carry credentials in its user info
(``http://user:PASS@host/mcp``) or in a query parameter (``?api_key=KEY``, ``?key=KEY``).
`public_url` is what a resolved config stores and a message prints: no user info, no query.
`without_url_credentials` keeps every part but the credentials: what the fingerprint hashes,
so that rotating a key is not "another config" while a changed non-secret query still is.
`url_credentials` lists the secret values in every form they are sent in, for the redactor.
"""

from __future__ import annotations

import base64
import re
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

#: A query parameter is a credential when its name, lower-cased with separators dropped,
#: contains one of these (the default `loop.redaction.secret_keys` written together, plus
#: `key`, `sig` and `signature`): erring on the side of hiding, as the redactor does.
_SECRET_QUERY_NEEDLES = (
    "token", "password", "passwd", "pwd", "passphrase", "secret", "apikey", "accesskey", "privatekey",
    "authorization", "auth", "credential", "cookie", "sessionid", "jwt", "key", "sig",
)  # fmt: skip
_SEPARATORS = re.compile(r"[\W_]+")


def secret_query_name(name: str) -> bool:
    """Whether a URL query parameter of this name carries a credential (`key`, `api_key`, ...)."""
    joined = _SEPARATORS.sub("", name.lower())
    return any(needle in joined for needle in _SECRET_QUERY_NEEDLES)


def public_url(url: str) -> str:
    """`url` without user info, query or fragment: where credentials hide in a base URL
    (`https://user:pass@host/v1`, `...?key=...`). Used for anything stored or printed."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal keeps its brackets
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""  # a malformed port: drop it rather than fail while making a safe copy
    return f"{parts.scheme}://{host}{port}{parts.path}" if parts.scheme else parts.path


def without_url_credentials(url: str) -> str:
    """`url` with its user info and credential query parameters removed, the rest as written.

    A URL without credentials comes back unchanged (same string), so fingerprints of configs
    that never had any are what they were."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in query if not secret_query_name(k)]
    has_user = "@" in parts.netloc
    if not has_user and len(kept) == len(query):
        return url
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(kept), parts.fragment))


def url_credentials(url: str) -> tuple[str, ...]:
    """The credential values of `url`, in every form a request or a message may carry them.

    The password (or the user, when there is none: a token in the user part), `user:pass`,
    its base64 (a `Basic` header) and the URL-encoded forms as written; each credential query
    parameter's value, decoded and encoded. A user name beside a password is not a credential
    (it would hide every "admin" in the transcripts). Same forms as
    `collector.episode.redact.credential_values`, which this layer cannot import."""
    parts = urlsplit(url)
    found: list[str] = []
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        raw_user, _, raw_password = userinfo.partition(":")
        user, password = unquote(raw_user), unquote(raw_password)
        pair = f"{user}:{password}"
        found += [password or user, pair, base64.b64encode(pair.encode()).decode()]
        found += [raw_password or raw_user, userinfo, quote(password or user, safe="")]
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if value and secret_query_name(name):
            found += [value, quote(value, safe=""), quote(value)]
    return tuple(dict.fromkeys(v for v in found if v))
