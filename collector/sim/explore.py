"""The simulated policy for a request no built-in template matches: play whatever tools it offers.

A user testing their own environment on the simulator should see tool calls, results and
rewards, not one canned sentence. So when the last user message matches none of the
policy's templates (`collector.sim.policy`), the simulated model reads the tools the request
offers and plays them:

1. one call turn calling every offered tool, in the order offered, each with arguments
   valid for its JSON Schema (`example_arguments`);
2. a tool whose result reads as an error (the same test the templates use) is called again,
   at most `MAX_ATTEMPTS` calls in all; a tool with a good result is not called again;
3. then one answer turn: ``name: result`` for each tool that answered, in order, joined by
   ``"; "`` (each result cut to `RESULT_CHARS` characters), so a grader that looks for the
   value a tool returned finds it;
4. offered no tools, it answers in text (`NO_TOOLS_ANSWER`): a text-action environment gets a
   text turn, every time.

Arguments are a pure function of the schema and the user's message, never of the seed, so a
task's call turn has one fixed size and the preset's cut rate for it stays exact
(`collector.sim.truth.plan_fixed_tokens`). Values, in order of preference: `const`; the
first `enum` value; `default`; then by type: an integer (or number) is the next number of the
user's message not used yet by this call that fits the bounds, else the lower bound (else 1);
a string is the next quoted text of the message ('...' or "...") not used yet that fits the
length bounds, else ``"example"`` (a known `format` gets a valid value of it); a boolean is
true; an array has `minItems` items (at least one) of its `items` schema; an object has its
`required` properties (all of them when it lists none) in the schema's order; `anyOf`/`oneOf`
take the first branch that is not null, `allOf` merges its branches, a local `$ref`
(`#/$defs/...`, as pydantic writes nested models) is followed. `pattern` is not honoured: a
value the environment's validator refuses is an error result, retried like any other.

Faults come from the preset as for every other turn: `generate` may bump one argument
(`error_rate`), break the JSON (`malformed_prob`), leak a delimiter, or cut the turn at the cap.

The token-in template (`collector.sim.completion`) renders tool names only: there every tool
is called with ``{}``.

Nothing here imports the rest of `collector`.

Tests: tests/sim/test_explore.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from collector.sim.plans import MAX_ATTEMPTS, HistoryItem, Plan, PlannedCall, tally

RESULT_CHARS = 200
"""Characters of each tool result the answer quotes (keeps an answer turn's size bounded)."""

NO_TOOLS_ANSWER = "I can help with orders, tickets, emails and arithmetic."
"""The answer to a request that matches no template and offers no tools."""

FALLBACK_STRING = "example"
_MAX_DEPTH = 8
"""Nesting past this depth (a recursive `$ref`) gets the shallowest valid value: null or {}."""

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")
_QUOTED = re.compile(r"'([^'\n]{1,200})'|\"([^\"\n]{1,200})\"")
_FORMATS = {
    "date": "2026-01-01",
    "date-time": "2026-01-01T00:00:00Z",
    "time": "00:00:00Z",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "ipv4": "127.0.0.1",
    "hostname": "example.com",
}


class _Pools:
    """The numbers and quoted strings of the user's message, handed out in order per call."""

    def __init__(self, text: str) -> None:
        self.numbers = [m.group(0) for m in _NUMBER.finditer(text)]
        self.strings = [m.group(1) or m.group(2) for m in _QUOTED.finditer(text)]

    def take_number(self, integer: bool, low: float | None, high: float | None) -> int | float | None:
        for i, text in enumerate(self.numbers):
            if integer and "." in text:
                continue
            value: int | float = int(text) if integer else (float(text) if "." in text else int(text))
            if (low is None or value >= low) and (high is None or value <= high):
                del self.numbers[i]
                return value
        return None

    def take_string(self, low: int, high: int | None) -> str | None:
        for i, text in enumerate(self.strings):
            if len(text) >= low and (high is None or len(text) <= high):
                del self.strings[i]
                return text
        return None


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#"):
        return schema
    node: Any = root
    for part in ref[1:].split("/"):
        if not part:
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or part not in node:
            return {}
        node = node[part]
    if not isinstance(node, Mapping):
        return {}
    rest = {k: v for k, v in schema.items() if k != "$ref"}
    return {**node, **rest}


def _type_of(schema: Mapping[str, Any]) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):
        named = [str(k).lower() for k in kind if str(k).lower() != "null"]
        return named[0] if named else "null"
    if isinstance(kind, str):
        return kind.lower()  # Gemini's OpenAPI subset writes STRING, OBJECT, ...
    if "properties" in schema or "required" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return None


def _value(schema: Any, root: Mapping[str, Any], pools: _Pools, depth: int) -> Any:
    if not isinstance(schema, Mapping):
        return FALLBACK_STRING  # `true` / a non-schema: anything is valid
    schema = _resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            chosen = next(
                (b for b in branches if isinstance(b, Mapping) and _type_of(_resolve(b, root)) != "null"),
                branches[0],
            )
            return _value(chosen, root, pools, depth)
    branches = schema.get("allOf")
    if isinstance(branches, list) and branches:
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for branch in branches:
            if isinstance(branch, Mapping):
                branch = _resolve(branch, root)
                props = {**merged.get("properties", {}), **branch.get("properties", {})}
                required = [*merged.get("required", []), *branch.get("required", [])]
                merged.update(branch)
                merged["properties"], merged["required"] = props, required
        return _value(merged, root, pools, depth)
    kind = _type_of(schema)
    if depth > _MAX_DEPTH:
        return {} if kind == "object" else None
    if kind == "object":
        return dict(_members(schema, root, pools, depth + 1))
    if kind == "array":
        count = max(1, int(schema.get("minItems", 0) or 0))
        items = schema.get("items", {})
        prefix = schema.get("prefixItems")
        if isinstance(prefix, list) and prefix:
            return [_value(s, root, pools, depth + 1) for s in prefix]
        return [_value(items, root, pools, depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        return _number(schema, kind == "integer", pools)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _string(schema, pools)


def _number(schema: Mapping[str, Any], integer: bool, pools: _Pools) -> int | float:
    low = schema.get("minimum")
    high = schema.get("maximum")
    if isinstance(schema.get("exclusiveMinimum"), int | float):
        low = schema["exclusiveMinimum"] + 1
    if isinstance(schema.get("exclusiveMaximum"), int | float):
        high = schema["exclusiveMaximum"] - 1
    low = low if isinstance(low, int | float) and not isinstance(low, bool) else None
    high = high if isinstance(high, int | float) and not isinstance(high, bool) else None
    taken = pools.take_number(integer, low, high)
    if taken is not None:
        return taken
    value: int | float = low if low is not None else (min(1, high) if high is not None else 1)
    if integer:
        value = int(value) if float(value).is_integer() else int(value) + 1
    return value


def _string(schema: Mapping[str, Any], pools: _Pools) -> str:
    low = schema.get("minLength", 0)
    high = schema.get("maxLength")
    low = low if isinstance(low, int) else 0
    high = high if isinstance(high, int) else None
    known = _FORMATS.get(str(schema.get("format", "")))
    if known is not None:
        return known
    taken = pools.take_string(low, high)
    if taken is not None:
        return taken
    text = FALLBACK_STRING
    if len(text) < low:
        text = (text * (low // len(text) + 1))[:low]
    if high is not None:
        text = text[:high]
    return text


def _members(
    schema: Mapping[str, Any], root: Mapping[str, Any], pools: _Pools, depth: int
) -> list[tuple[str, Any]]:
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    required = schema.get("required")
    names = [str(n) for n in required] if isinstance(required, list) else list(props)
    ordered = [n for n in props if n in names] + [n for n in names if n not in props]
    return [(name, _value(props.get(name, {}), root, pools, depth)) for name in ordered]


def example_arguments(schema: Mapping[str, Any] | None, prompt: str) -> tuple[tuple[str, Any], ...]:
    """Arguments valid for the tool's parameters `schema` (an object schema), taking numbers and
    quoted strings from `prompt` where they fit (see the module docstring)."""
    if not isinstance(schema, Mapping):
        return ()
    return tuple(_members(_resolve(schema, schema), schema, _Pools(prompt), 1))


def _summary(results: list[tuple[str, str]]) -> str:
    return "; ".join(f"{name}: {text.strip()[:RESULT_CHARS]}" for name, text in results)


def explore(
    history: list[HistoryItem], tools: frozenset[str], schemas: Mapping[str, Mapping[str, Any]] | None
) -> Plan:
    """The next move for a conversation whose last user message matches no template."""
    start = max((i for i, item in enumerate(history) if item[0] == "user"), default=-1)
    prompt = history[start][1] if start >= 0 else ""
    names = list(schemas) if schemas else sorted(tools)
    if not names:
        return Plan(answer=NO_TOOLS_ANSWER, task="explore")
    ok, attempts = tally(history[start + 1 :])
    pending = [n for n in names if n not in ok and attempts.get(n, 0) < MAX_ATTEMPTS]
    if not pending:
        answered = [(n, ok[n]) for n in names if n in ok]
        if not answered:
            return Plan(answer="None of the tools worked.", task="explore")
        return Plan(answer=_summary(answered), task="explore")
    calls = tuple(
        PlannedCall(name, example_arguments((schemas or {}).get(name, {"type": "object"}), prompt))
        for name in pending
    )
    return Plan(calls=calls, task="explore")
