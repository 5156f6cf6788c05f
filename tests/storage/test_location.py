"""Where a run lives: `parse_location` refuses, when the path is parsed, the s3:// prefixes that
the writer would accept and every reader refuse (``a//b``, ``a/./b``, ``c/../d``)."""

from __future__ import annotations

import pytest

from collector.errors import OutputError
from collector.storage.location import ObjectLocation, parse_location


@pytest.mark.parametrize("uri", [
    "s3://bucket-x/a//b", "s3://bucket-x/a/./b", "s3://bucket-x/c/../d", "s3://bucket-x//a",
    "s3://bucket-x/a/b//", "s3://bucket-x/..", "s3://bucket-x/./run",
])
def test_a_prefix_with_empty_dot_or_dotdot_segments_is_refused_in_one_line(uri: str) -> None:
    with pytest.raises(OutputError) as info:
        parse_location(uri)
    message = str(info.value)
    assert message.startswith(uri + ":")
    assert "'..' segments or '//'" in message
    assert "\n" not in message


@pytest.mark.parametrize(("uri", "prefix"), [
    ("s3://bucket-x/a/b", "a/b"), ("s3://bucket-x/a/b/", "a/b"), ("s3://bucket-x", ""),
    ("s3://bucket-x/", ""), ("s3://bucket-x/a.b/..c/d..", "a.b/..c/d.."),
])
def test_plain_prefixes_are_kept(uri: str, prefix: str) -> None:
    assert parse_location(uri) == ObjectLocation("s3", "bucket-x", prefix)


def test_credentials_never_reach_the_message() -> None:
    with pytest.raises(OutputError) as info:
        parse_location("s3://KEYID:sekrit@bucket-x/a//b")
    assert "sekrit" not in str(info.value)
    assert "KEYID" not in str(info.value)
