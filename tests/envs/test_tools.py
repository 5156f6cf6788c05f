"""Tools: schemas from typed callables, strict validation before running, failures as results."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from collector.envs import schemas, toolkit
from collector.envs.base import Tool
from collector.envs.toolkit import check_schema, run_tool, tool, tool_specs


def refund(order_id: str, amount: float, note: str = "") -> str:
    """Refund an order.

    Longer text that is not part of the description.
    """
    return f"{order_id}:{amount}:{note}"


class EmailArgs(BaseModel):
    to: str
    subject: str = Field(max_length=20)
    priority: Literal["low", "high"] = "low"


def send(args: EmailArgs) -> dict[str, str]:
    """Send an email."""
    return {"to": args.to, "priority": args.priority}


def test_schema_from_typed_callable() -> None:
    """Parameters become properties, defaults make them optional, titles are dropped."""
    t = tool(refund)
    assert t.name == "refund"
    assert t.description == "Refund an order."
    assert t.parameters["required"] == ["order_id", "amount"]
    assert t.parameters["properties"]["amount"] == {"type": "number"}
    assert t.parameters["additionalProperties"] is False
    assert "title" not in t.parameters
    spec = tool_specs([t])[0]
    assert (spec.name, spec.parameters) == ("refund", t.parameters)


def test_schema_from_pydantic_model() -> None:
    """A callable taking one pydantic model exposes the model's fields as its arguments."""
    t = tool(send, gate=True)
    assert set(t.parameters["properties"]) == {"to", "subject", "priority"}
    assert t.parameters["properties"]["priority"]["enum"] == ["low", "high"]
    assert t.gate


async def test_valid_call_runs_with_defaults_filled() -> None:
    """A valid call runs; omitted optional arguments take their defaults; non-str results are JSON."""
    out = await run_tool(tool(refund), {"order_id": "A", "amount": 1000}, 1.0)
    assert (out.content, out.is_error, out.ran) == ("A:1000.0:", False, True)
    out = await run_tool(tool(send), {"to": "x@y", "subject": "hi"}, 1.0)
    assert out.content == '{"to": "x@y", "priority": "low"}'


async def test_validation_is_strict_and_does_not_echo_values() -> None:
    """Strings for numbers, unknown keys and missing keys are refused before running, values unechoed."""
    t = tool(refund)
    out = await run_tool(t, {"order_id": "A", "amount": "SECRET-1000"}, 1.0)
    assert out.is_error
    assert not out.ran
    assert "amount" in out.content
    assert "SECRET" not in out.content
    out = await run_tool(t, {"order_id": "A", "amount": 1, "amuont": 2}, 1.0)
    assert out.is_error
    assert "amuont" in out.content
    out = await run_tool(t, {"amount": 1}, 1.0)
    assert out.is_error
    assert "order_id" in out.content
    out = await run_tool(tool(send), {"to": "x", "subject": "s", "priority": "urgent"}, 1.0)
    assert out.is_error
    assert "priority" in out.content


async def test_raw_schema_tools_are_checked_against_the_schema() -> None:
    """A Tool built by hand from a JSON Schema is validated against that schema subset."""
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["n"],
        "additionalProperties": False,
    }
    t = Tool("count", "count", schema, lambda n, tags=(): n + len(tags), inline=True)
    assert (await run_tool(t, {"n": 2, "tags": ["a"]}, 1.0)).content == "3"
    for bad in ({"n": True}, {"n": 1.5}, {}, {"n": 1, "x": 0}, {"n": 1, "tags": [1]}):
        out = await run_tool(t, bad, 1.0)
        assert out.is_error, bad
        assert not out.ran, bad
    check_schema({"enum": [1, 2]}, 2)


async def test_exceptions_and_hangs_become_error_results() -> None:
    """A raising tool, a hung coroutine and a hung thread each give an error result, not a crash."""

    def boom() -> str:
        """Boom."""
        raise ValueError("bad thing")

    async def hang() -> str:
        """Hang."""
        await asyncio.sleep(3600)
        return ""

    def block() -> str:
        """Block a thread."""
        time.sleep(0.2)
        return "late"

    def own_timeout() -> str:
        """Raise a TimeoutError of its own."""
        raise TimeoutError("upstream")

    assert (await run_tool(tool(boom), {}, 1.0)).content == "error: boom failed: ValueError: bad thing"
    assert (await run_tool(tool(hang), {}, 0.01)).content == "error: hang timed out after 0.01 s"
    assert (await run_tool(tool(block), {}, 0.01)).content == "error: block timed out after 0.01 s"
    out = await run_tool(tool(own_timeout, inline=True), {}, 5.0)
    assert out.content == "error: own_timeout failed: TimeoutError: upstream"


async def test_async_tools_and_per_tool_timeout() -> None:
    """Coroutine tools are awaited; a tool's own timeout overrides the loop default."""

    async def quick(x: int) -> int:
        """Quick."""
        await asyncio.sleep(0)
        return x * 2

    async def slowish() -> str:
        """Slow."""
        await asyncio.sleep(3600)
        return ""

    assert (await run_tool(tool(quick), {"x": 4}, 1.0)).content == "8"
    out = await run_tool(tool(slowish, timeout_s=0.01), {}, 3600)
    assert out.content == "error: slowish timed out after 0.01 s"


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"$ref": "#"}, "a $ref cycle"),
        (
            {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"$ref": "#/$defs/a"}},
             "$ref": "#/$defs/a"},
            "a $ref cycle",
        ),
        (
            {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}},
            "'#/$defs/missing' resolves to nothing",
        ),
        ({"properties": {"x": {"$ref": "http://127.0.0.1:9/remote.json"}}}, "resolves to nothing"),
        (_nested(3000), "cannot be compiled: RecursionError"),
    ],
    ids=["self", "mutual-through-allOf", "dangling", "remote", "nested-3000"],
)
def test_a_schema_that_cannot_be_compiled_is_refused_when_the_tool_is_built(
    schema: dict[str, Any], message: str
) -> None:
    """Self-referencing, dangling and remote `$ref`s, and nesting past the stack, are refused
    with one ValueError line when the tool is built, not at the first call."""
    with pytest.raises(ValueError, match=r"^[^\n]*" + message.replace("$", r"\$").replace("(", r"\(")):
        tool(lambda **a: a, name="t", parameters=schema)


async def test_recursive_schemas_that_descend_are_accepted_and_checked() -> None:
    """A tree schema refers to itself below a property (each step moves into the value): it
    compiles, and calls are validated through the reference."""
    tree = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["name"],
        "$defs": {"unused": {"$ref": "#/properties/name"}},
    }
    t = tool(lambda **a: "ok", name="tree", parameters=tree, inline=True)
    good = await run_tool(t, {"name": "r", "children": [{"name": "c", "children": []}]}, 1.0)
    assert good.content == "ok"
    bad = await run_tool(t, {"name": "r", "children": [{"children": []}]}, 1.0)
    assert bad.is_error
    assert "arguments.children.0.name: field required" in bad.content
    # Nested `$id` resources resolve as the validator resolves them; a pydantic model's
    # `$defs` (what an SDK server lists) compile too.
    scoped = {
        "$id": "https://example.com/root.json",
        "$defs": {"n": {"$id": "nested.json", "$defs": {"k": {"type": "integer"}},
                        "properties": {"v": {"$ref": "#/$defs/k"}}}},
        "properties": {"y": {"$ref": "nested.json"}},
    }
    s = tool(lambda **a: "ok", name="scoped", parameters=scoped, inline=True)
    assert (await run_tool(s, {"y": {"v": 1}}, 1.0)).content == "ok"
    assert (await run_tool(s, {"y": {"v": "one"}}, 1.0)).is_error
    tool(lambda **a: "ok", name="model", parameters=EmailArgs.model_json_schema())


async def test_a_validator_failure_at_a_call_is_that_calls_error_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever the validator raises at a call (RecursionError, a resolver error, anything) is
    an error result with ran=False, never an exception out of `run_tool`."""
    monkeypatch.setattr(schemas, "_check_references", lambda schema, cls: None)  # what compiling missed
    monkeypatch.setattr(schemas, "_SCHEMA_CACHE", {})  # nor may it leave that validator cached
    looping = tool(lambda **a: "ran", name="looping", parameters={"$ref": "#"}, inline=True)
    out = await run_tool(looping, {"x": 1}, 1.0)
    assert (out.is_error, out.ran) == (True, False)
    assert out.content == "error: looping: its schema could not be checked (RecursionError); nothing was run"

    def explode(arguments: object) -> Any:
        raise KeyError("resolver")

    broken = Tool("broken", "d", {"type": "object"}, lambda: "ran", validator=explode, inline=True)
    out = await run_tool(broken, {}, 1.0)
    assert (out.is_error, out.ran) == (True, False)
    assert "could not be checked (KeyError)" in out.content
    monkeypatch.undo()  # compiled as usual again: a hand-built Tool's schema is compiled at its call
    hand_built = Tool("hand", "d", {"$ref": "#/$defs/nowhere"}, lambda: "ran", inline=True)
    out = await run_tool(hand_built, {}, 1.0)
    assert (out.is_error, out.ran) == (True, False)
    assert "hand has an invalid schema: $ref '#/$defs/nowhere' resolves to nothing" in out.content


async def test_a_result_over_the_byte_bound_is_an_error_result() -> None:
    """`max_result_bytes` counts UTF-8 bytes: at the bound a result passes, one byte over (or a
    multi-byte text over it in bytes though not in characters) is an error naming the size;
    without a bound given, DEFAULT_MAX_RESULT_BYTES (1 MiB) applies."""
    echo = tool(lambda text: text, name="echo", parameters={"type": "object"}, inline=True)
    assert (await run_tool(echo, {"text": "a" * 100}, 1.0, max_result_bytes=100)).content == "a" * 100
    over = await run_tool(echo, {"text": "a" * 101}, 1.0, max_result_bytes=100)
    assert (over.is_error, over.ran) == (True, True)
    assert over.content == (
        "error: echo returned 101 bytes, over loop.max_tool_result_bytes = 100; "
        "the result was dropped"
    )
    wide = await run_tool(echo, {"text": "é" * 60}, 1.0, max_result_bytes=100)  # 60 characters, 120 bytes
    assert wide.is_error
    assert "returned 120 bytes" in wide.content
    assert not (await run_tool(echo, {"text": "é" * 50}, 1.0, max_result_bytes=100)).is_error
    far = await run_tool(echo, {"text": "a" * 401}, 1.0, max_result_bytes=100)  # not encoded to be measured
    assert "returned at least 401 bytes" in far.content
    assert toolkit.DEFAULT_MAX_RESULT_BYTES == 1024 * 1024
    huge = await run_tool(echo, {"text": "b" * (toolkit.DEFAULT_MAX_RESULT_BYTES + 1)}, 1.0)
    assert huge.is_error
    assert "over loop.max_tool_result_bytes = 1,048,576" in huge.content
