"""Tools given as JSON Schema: compiling a schema once, and checking a call's arguments.

Part of the tools (`collector.envs.toolkit` re-exports every name here). Tests:
tests/envs/test_tools.py, tests/system/envs/test_mcp.py.

Checked with the `jsonschema` package
(the schema's own draft, Draft 2020-12 when it names none). A schema is compiled once
(cached by its JSON text): one that is not valid JSON Schema, has a `$ref` that resolves
nowhere (dangling, or remote: nothing is fetched) or a `$ref` cycle that never moves into
the value (`{"$ref": "#"}`, which the validator would follow until RecursionError) is
refused with a one-line `ValueError`. Whatever the validator still raises at a call is a
`ToolSchemaError`; a mismatch is a `ToolArgumentError` whose message names the field and
keyword, never the value (it may be a secret).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.validators

from collector.envs.base import ArgumentValidator
from collector.turn import JSONObject

__all__ = ["MAX_SCHEMA_NODES", "ToolArgumentError", "ToolSchemaError", "check_schema", "schema_validator"]


class ToolArgumentError(ValueError):
    """Arguments do not match the tool's schema. The message names fields, never values."""


class ToolSchemaError(ValueError):
    """A tool's schema failed while checking one call's arguments (not the arguments' fault)."""


_SCHEMA_CACHE: dict[str, ArgumentValidator] = {}


def schema_validator(schema: Mapping[str, Any]) -> ArgumentValidator:
    """A validator passing arguments as keywords once they satisfy `schema` (cached per schema).

    Raises `ValueError` naming the problem when `schema` itself is not valid JSON Schema.
    """
    schema = dict(schema)
    try:
        key = json.dumps(schema, sort_keys=True, default=str)
    except (RecursionError, ValueError) as exc:  # nested past the stack, or a circular object
        raise ValueError(f"cannot be compiled: {type(exc).__name__} reading it") from None
    found = _SCHEMA_CACHE.get(key)
    if found is not None:
        return found
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
        _check_references(schema, cls)
    except jsonschema.exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise ValueError(f"not a valid JSON Schema at {where}: {exc.message[:200]}") from None
    except ValueError:
        raise
    # Broad on purpose: whatever the validator trips over while compiling is this schema's
    # refusal, one line, never a crash of the caller (a worker opening an MCP session).
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"cannot be compiled: {type(exc).__name__}: {_short(exc, 160)}") from None
    checker = cls(schema, format_checker=cls.FORMAT_CHECKER)

    def validate(arguments: JSONObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
        try:
            errors = sorted(checker.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        # Broad on purpose: a failure of the validator itself (a reference it cannot resolve,
        # a recursion the compile check missed) is this call's error result, never the worker's.
        except Exception as exc:  # noqa: BLE001
            raise ToolSchemaError(f"its schema could not be checked ({type(exc).__name__})") from None
        if errors:
            raise ToolArgumentError("; ".join(_schema_problem(e) for e in errors[:5]))
        return (), dict(arguments) if isinstance(arguments, dict) else {}

    _SCHEMA_CACHE[key] = validate
    return validate


#: Keywords that apply a subschema to the *same* instance: a cycle through them alone (a
#: `$ref` back to itself, two definitions referring to each other) never ends.
_IN_PLACE = frozenset({"allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas"})
_REFS = ("$ref", "$dynamicRef")
#: Keywords whose value maps names to subschemas.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
#: Keywords whose values are data, not subschemas (a `$ref` key in an enum value is no reference).
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
#: The most subschemas the reference check walks: a schema larger than this is refused.
MAX_SCHEMA_NODES = 20_000


def _check_references(schema: Mapping[str, Any], cls: Any) -> None:
    """Raise `ValueError` for a `$ref` that resolves nowhere (dangling, or remote: nothing is
    fetched) and for a reference cycle that never moves into the instance (`{"$ref": "#"}`),
    which the validator would follow until RecursionError at the first call.

    Iterative, so a deeply nested schema cannot exhaust the stack here either."""
    import referencing
    import referencing.exceptions
    import referencing.jsonschema

    spec = referencing.jsonschema.specification_with(
        str(schema.get("$schema", "https://json-schema.org/draft/2020-12/schema")),
        default=referencing.jsonschema.DRAFT202012,
    )
    # As the validator resolves: the root under its own `$id` (if any), every nested `$id`
    # resource found by crawling, and nothing retrieved from outside.
    resource = spec.create_resource(schema)
    root = resource.id() or ""
    resolver: Any = referencing.Registry().with_resource(root, resource).crawl().resolver(base_uri=root)
    # Every subschema, with the resolver of its scope (`$id` changes the base of a `$ref`).
    edges: dict[int, list[int]] = {}
    nodes: dict[int, Any] = {}
    stack: list[tuple[Any, Any, bool]] = [(schema, resolver, True)]
    while stack:
        node, scope, is_schema = stack.pop()
        if isinstance(node, list):
            stack.extend((item, scope, is_schema) for item in node)
            continue
        if not isinstance(node, dict) or id(node) in nodes:
            continue
        nodes[id(node)] = node
        if len(nodes) > MAX_SCHEMA_NODES:
            raise ValueError(f"more than {MAX_SCHEMA_NODES:,} subschemas")
        if not is_schema:
            stack.extend((value, scope, False) for value in node.values())
            continue
        if isinstance(node.get("$id"), str) and node is not schema:
            scope = scope.in_subresource(spec.create_resource(node))
        targets = edges.setdefault(id(node), [])
        for keyword in _REFS:
            ref = node.get(keyword)
            if not isinstance(ref, str):
                continue
            try:
                resolved = scope.lookup(ref)
            except referencing.exceptions.Unresolvable:
                raise ValueError(f"{keyword} {ref[:80]!r} resolves to nothing in the schema") from None
            if isinstance(resolved.contents, dict):
                targets.append(id(resolved.contents))
                stack.append((resolved.contents, resolved.resolver, True))
        for keyword, value in node.items():
            if keyword in _REFS:
                continue
            if keyword in _SCHEMA_MAPS and isinstance(value, dict):
                children = list(value.values())
            else:
                children = value if isinstance(value, list) else [value]
            for item in children:
                if keyword in _IN_PLACE and isinstance(item, dict):
                    targets.append(id(item))
                stack.append((item, scope, keyword not in _DATA_KEYWORDS))
    _refuse_in_place_cycles(edges)


def _refuse_in_place_cycles(edges: Mapping[int, list[int]]) -> None:
    # Depth-first with colours, iterative: grey = on the current in-place path.
    colour: dict[int, int] = {}
    for start in edges:
        if colour.get(start):
            continue
        colour[start] = 1
        path: list[tuple[int, Iterator[int]]] = [(start, iter(edges.get(start, ())))]
        while path:
            node, pending = path[-1]
            step = next(pending, None)
            if step is None:
                colour[node] = 2
                path.pop()
            elif colour.get(step) == 1:
                raise ValueError('a $ref cycle applies to the same value without end (like {"$ref": "#"})')
            elif not colour.get(step):
                colour[step] = 1
                path.append((step, iter(edges.get(step, ()))))


def _schema_problem(error: jsonschema.exceptions.ValidationError) -> str:
    # jsonschema's own message quotes the value (it may be a secret): name field and keyword.
    where = ".".join(["arguments", *(str(p) for p in error.absolute_path)])
    keyword = str(error.validator)
    instance: Any = error.instance
    if keyword == "required" and isinstance(instance, dict) and isinstance(error.validator_value, list):
        missing = [k for k in error.validator_value if k not in instance]
        return f"{where}.{missing[0] if missing else '?'}: field required"
    if keyword == "additionalProperties" and isinstance(instance, dict) and isinstance(error.schema, Mapping):
        properties: Any = error.schema.get("properties", {})
        known = set(properties)
        extra = sorted(str(k) for k in instance if k not in known)
        return f"{where}.{extra[0][:64] if extra else '?'}: unknown argument"
    if keyword == "type":
        return f"{where}: expected {error.validator_value}, got {type(error.instance).__name__}"
    if keyword in ("enum", "const"):
        return f"{where}: not one of the allowed values"
    limit = json.dumps(error.validator_value, default=str)
    return f"{where}: fails {keyword} {limit[:80]}"


def check_schema(schema: Mapping[str, Any], value: Any, where: str = "arguments") -> None:
    """Raise `ToolArgumentError` when `value` breaks `schema` (checked with `jsonschema`)."""
    del where  # kept for callers; the messages name the field path themselves
    schema_validator(schema)(value)


def _short(exc: Exception, limit: int) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "..."
