"""Argument parsing: strict JSON objects first, two recorded conservative repairs, nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.providers import arguments
from collector.providers.arguments import (
    LEAKED_DELIMITERS,
    has_template_opener,
    parse_arguments,
    strip_delimiters,
    unclosed_template,
)
from collector.turn import ArgStatus


def test_strict_object_is_ok_and_untouched() -> None:
    """Valid JSON objects parse as OK with no repair recorded."""
    assert parse_arguments('{"path": "README.md"}') == ({"path": "README.md"}, ArgStatus.OK, None)


def test_refund_cut_after_digits_stays_malformed() -> None:
    """The refund cut at `"amount": 10` is never completed into a 10."""
    value, status, repair = parse_arguments('{"order_id": "A-1001", "amount": 10')
    assert (value, status, repair) == (None, ArgStatus.MALFORMED, None)


@pytest.mark.parametrize(
    "text", ["", "   ", "{", '{"', '{"status": "op', "{,", "null", "[]", "1", '"x"', "[{}]"]
)
def test_not_an_object_is_malformed(text: str) -> None:
    """Empty, cut or non-object text is MALFORMED: never defaulted to `{}` (the close_tickets bug)."""
    assert parse_arguments(text).status is ArgStatus.MALFORMED


@pytest.mark.parametrize("text", ['{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}'])
def test_non_standard_constants_are_refused(text: str) -> None:
    """NaN and Infinity are not JSON and never reach a tool."""
    assert parse_arguments(text).status is ArgStatus.MALFORMED


def test_trailing_gemma_closer_is_stripped() -> None:
    """A trailing `<tool_call|>` leaked by a gateway is stripped and recorded."""
    text = '{"tool":"GMAIL_CREATE_EMAIL_DRAFT","x":1}<tool_call|>'
    assert parse_arguments(text) == (
        {"tool": "GMAIL_CREATE_EMAIL_DRAFT", "x": 1},
        ArgStatus.REPAIRED,
        "strip_delimiters",
    )


def test_call_wrapped_in_tool_call_tags() -> None:
    """Arguments wrapped in `<tool_call>` tags are recovered by stripping the tags."""
    assert parse_arguments('<tool_call>{"q":"hi"}</tool_call>') == (
        {"q": "hi"},
        ArgStatus.REPAIRED,
        "strip_delimiters",
    )


def test_concatenated_fragments_keep_first_object() -> None:
    """A valid object followed by a delimiter and a second fragment keeps only the first."""
    value, status, repair = parse_arguments('{"tool":"gmail"}<tool_call|>{"tool":"other"}')
    assert (value, status, repair) == (
        {"tool": "gmail"},
        ArgStatus.REPAIRED,
        "strip_delimiters+leading_object",
    )


def test_concatenated_objects_without_delimiter() -> None:
    """Two concatenated objects without a delimiter keep the first, recorded as leading_object."""
    assert parse_arguments('{"a":1}{"a":2}') == ({"a": 1}, ArgStatus.REPAIRED, "leading_object")


def test_leading_object_with_cut_second_fragment() -> None:
    """A complete first object followed by a cut second fragment keeps the first object."""
    assert parse_arguments('{"a":1} {"b": 2').value == {"a": 1}


def test_stray_bracket_blob_stays_malformed() -> None:
    """The real-world stray `]` blob is unrecoverable and stays MALFORMED."""
    assert parse_arguments('{"arguments":{"body":"hi"]}}<tool_call|>').status is ArgStatus.MALFORMED


def test_marker_inside_string_value_is_left_alone() -> None:
    """A delimiter inside a legitimate string value parses strictly and is not rewritten."""
    assert parse_arguments('{"body":"use <tool_call|> literally"}') == (
        {"body": "use <tool_call|> literally"},
        ArgStatus.OK,
        None,
    )


def test_marker_inside_string_survives_a_repair() -> None:
    """When a repair runs, delimiters inside string values are kept; only outer ones go."""
    value, status, _ = parse_arguments('{"body":"say <tool_call|> \\" ok"}<tool_call|>')
    assert status is ArgStatus.REPAIRED
    assert value == {"body": 'say <tool_call|> " ok'}


def test_text_after_object_is_not_noise() -> None:
    """An object followed by arbitrary text is refused: only delimiters or fragments may follow."""
    assert parse_arguments('{"a":1} and then some').status is ArgStatus.MALFORMED


def test_cut_text_with_delimiter_is_not_closed() -> None:
    """Stripping delimiters never closes a cut object."""
    assert parse_arguments('<tool_call>{"amount": 10').status is ArgStatus.MALFORMED


def test_deepseek_markers_are_stripped() -> None:
    """DeepSeek's full-width markers (U+FF5C, U+2581) are in the table and stripped."""
    text = '{"location": "Tokyo"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    assert parse_arguments(text) == ({"location": "Tokyo"}, ArgStatus.REPAIRED, "strip_delimiters")


def test_strip_delimiters_reports_removal() -> None:
    """strip_delimiters says whether it removed anything, and copies string contents verbatim."""
    assert strip_delimiters('{"a":"<tool_call>"}') == ('{"a":"<tool_call>"}', False)
    assert strip_delimiters('<|python_tag|>{"a":1}<|eom_id|>') == ('{"a":1}', True)


def test_no_lenient_json_library_is_imported() -> None:
    """The argument module depends on the standard json module only."""
    source = Path(arguments.__file__).read_text(encoding="utf-8")
    for name in ("json_repair", "json5", "demjson", "dirtyjson", "partial_json"):
        assert f"import {name}" not in source


@pytest.mark.parametrize(
    ("text", "opener"),
    [
        (
            '<tool_call>\n{"name": "write_file", "arguments": {"path": "out.py", "content": "import os',
            "<tool_call>",
        ),
        ('<|tool_call>call:get_weather{city:<|"|>Par', "<|tool_call>"),
        ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Pa', "<|python_tag|>"),
        ('[TOOL_CALLS] [{"name": "f", "arguments": {"a"', "[TOOL_CALLS]"),
        ('[TOOL_CALLS]get_weather[ARGS]{"city": "Zü', "[ARGS]"),
        ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get<｜tool▁sep｜>{", "<｜tool▁calls▁begin｜>"),
    ],
)
def test_unclosed_template_found(text: str, opener: str) -> None:
    """An opened but unclosed tool-call block is found, named by its opener."""
    assert unclosed_template(text) == opener
    assert has_template_opener(text)


@pytest.mark.parametrize(
    "text",
    [
        "Plain answer: 42.",
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
        '<|python_tag|>{"name": "f", "parameters": {"a": 1}}',
        '[TOOL_CALLS]f[ARGS]{"a": 1}',
        "<|tool_call>call:f{a:1}<tool_call|>",
    ],
)
def test_closed_or_absent_template_is_not_unclosed(text: str) -> None:
    """A closed block, or text without any block, is not an unclosed template."""
    assert unclosed_template(text) is None


def test_closed_block_is_still_an_unparsed_call() -> None:
    """A closed template block in the text is still reported as an unparsed tool call."""
    assert has_template_opener('<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert not has_template_opener("The answer is 4 [citation].")


@given(st.text())
def test_parse_never_raises(text: str) -> None:
    """Any text parses to OK, REPAIRED or MALFORMED without raising; an object only when not MALFORMED."""
    value, status, repair = parse_arguments(text)
    assert (value is None) == (status is ArgStatus.MALFORMED)
    assert (repair is None) == (status is not ArgStatus.REPAIRED)
    unclosed_template(text)
    has_template_opener(text)


@given(
    st.dictionaries(st.text(), st.text() | st.integers() | st.booleans()), st.sampled_from(LEAKED_DELIMITERS)
)
def test_valid_objects_survive_one_leaked_delimiter(obj: dict[str, object], delim: str) -> None:
    """A valid object followed by any one leaked delimiter is recovered exactly."""
    text = json.dumps(obj, ensure_ascii=False) + delim
    value, status, _ = parse_arguments(text)
    assert status is not ArgStatus.MALFORMED
    assert value == obj


@given(st.dictionaries(st.text(min_size=1), st.integers(), min_size=1), st.data())
def test_no_strict_prefix_of_an_object_is_ever_accepted(obj: dict[str, int], data: st.DataObject) -> None:
    """No cut of a serialized object (prefix) is ever accepted as a different object."""
    text = json.dumps(obj)
    cut = data.draw(st.integers(min_value=0, max_value=len(text) - 1))
    value, status, _ = parse_arguments(text[:cut])
    assert (value, status) == (None, ArgStatus.MALFORMED)
