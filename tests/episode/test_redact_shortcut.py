"""The ASCII shortcut of `Redactor.redact_text` never changes what the pattern pass would store."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.episode.redact import _BASIC, _BEARER, REDACTED, Redactor

_PIECES = st.sampled_from([
    "api_key", "API-KEY", "Api_Key", "token", "x-auth-token", "pass_word", "password", "Secret",
    "bearer ", "Bearer abcdefgh12345678", "authorization", "cookie", "refund", "order", "amount",
    "basic ", "Basic Ym9iOmh1bnRlcjI=", "authToken", "oauth", "author", "pwd", "session.id", "keyboard",
    ": ", "=", " ", "\"", "'", ",", "1000", "sk-abc123456789", "{", "}", "\n", "-", "_",
])


def _pattern_only(redactor: Redactor, text: str) -> str:
    paired = redactor._redact_pairs(text)
    return _BASIC.sub(r"\1" + REDACTED, _BEARER.sub(r"\1" + REDACTED, paired))


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=12).map("".join))
def test_shortcut_matches_the_full_pattern_pass(text: str) -> None:
    """For ASCII text that is not JSON, the shortcut returns exactly what the two patterns return."""
    redactor = Redactor()
    if text.lstrip()[:1] in ("{", "["):
        text = "x" + text  # JSON-looking text takes the key-based branch, tested elsewhere
    assert redactor.redact_text(text) == _pattern_only(redactor, text)


def test_non_ascii_secret_names_skip_the_shortcut() -> None:
    """A configured secret name outside ASCII still redacts: the shortcut is not taken for it."""
    redactor = Redactor(["ſecret"])  # long s: `(?i)` matches it to "s"
    assert REDACTED in redactor.redact_text("secret=hunter2")
