"""Tool schemas of a TRL environment class, built by the rules TRL builds them by.

TRL's `GRPOTrainer(environment_factory=...)` offers every public method of the environment
(``inspect.getmembers(instance, inspect.ismethod)``: bound methods, so class methods count and
static methods do not; names in alphabetical order; not `reset`, not `get_reward`, not a
name starting with ``_``) as a tool, and renders each through transformers'
`get_json_schema`. These functions follow those rules without importing either package:

- the description is the docstring's text before its ``Args:`` / ``Returns:`` / ``Raises:``
  section; a method without a docstring is refused;
- every parameter needs a type hint and a line in the Google-style ``Args:`` section
  (``name: description``, continuation lines joined by one space); a parameter without one
  is refused. A description ending in ``(choices: ["a", "b"])`` becomes an `enum`;
- a parameter without a default is `required`;
- types: `int` integer, `float` number, `str` string, `bool` boolean, `Any` anything,
  `None` null, any other class object; `Literal[...]` an `enum` of its values typed by
  them; `list[X]` an array of X; `tuple[X, Y]` `prefixItems` (a one-element or `...` tuple
  is refused, as transformers refuses it); `dict[K, V]` an object whose values are V;
  ``X | None`` X marked ``"nullable": true``; a union of basic types a list of types,
  others `anyOf`.

What differs, deliberately: ``*args`` / ``**kwargs`` parameters are refused (transformers
would offer a required argument named ``kwargs``). The schema offered to the model is TRL's;
arguments are checked against the same schema with ``nullable`` read as "null is allowed",
so a call with a wrong type gets an error result and nothing runs (TRL calls the method
with whatever arguments were parsed).

Tests: tests/envs/test_trl.py.
"""

from __future__ import annotations

import inspect
import json
import re
import types
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

NOT_TOOLS = frozenset({"reset", "get_reward"})
"""Public methods TRL does not offer: the episode's start, and the environment's own reward."""

_SECTION = re.compile(r"^\s*(Args|Returns|Raises):\s*$")
_ARG_LINE = re.compile(r"^\s*(\w+):\s*(.*)$")
_CHOICES = re.compile(r"\(choices:\s*(.*?)\)\s*$", re.IGNORECASE)
_BASIC: dict[Any, dict[str, Any]] = {
    int: {"type": "integer"},
    float: {"type": "number"},
    str: {"type": "string"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    Any: {},
}


class UnusableToolMethod(ValueError):
    """A method TRL could not turn into a tool (no docstring, an undescribed or untyped argument)."""


def tool_method_names(instance: object) -> list[str]:
    """The names of the methods TRL offers as tools, in TRL's (alphabetical) order."""
    return [
        name
        for name, _ in inspect.getmembers(instance, predicate=inspect.ismethod)
        if name not in NOT_TOOLS and not name.startswith("_")
    ]


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {argument: description}) of a Google-style docstring."""
    lines = doc.strip().splitlines()
    description: list[str] = []
    args: dict[str, list[str]] = {}
    section: str | None = None
    current: str | None = None
    for line in lines:
        header = _SECTION.match(line)
        if header:
            section = header.group(1)
            current = None
            continue
        if section is None:
            description.append(line)
        elif section == "Args" and line.strip():
            found = _ARG_LINE.match(line)
            if found:
                current = found.group(1)
                args[current] = [found.group(2).strip()]
            elif current is not None:
                args[current].append(line.strip())
    text = "\n".join(description).strip()
    return text, {name: " ".join(p for p in parts if p) for name, parts in args.items()}


def _type_schema(hint: Any, where: str) -> dict[str, Any]:
    origin = get_origin(hint)
    args = get_args(hint)
    if origin is None:
        return dict(_BASIC.get(hint, {"type": "object"}))
    if origin is Union or origin is types.UnionType:
        subtypes = [_type_schema(t, where) for t in args if t is not type(None)]
        if len(subtypes) == 1:
            out = subtypes[0]
        elif all(isinstance(s.get("type"), str) for s in subtypes):
            out = {"type": sorted(s["type"] for s in subtypes)}
        else:
            out = {"anyOf": subtypes}
        if type(None) in args:
            out["nullable"] = True
        return out
    if origin is Literal and args:
        kinds: list[str] = []
        for value in args:
            if type(value) not in (int, float, str, bool, type(None)):
                raise UnusableToolMethod(
                    f"{where}: Literal may list only str, int, float, bool or None values")
            kind = _BASIC[type(value)]["type"]
            if kind not in kinds:
                kinds.append(kind)
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(args)}
    if origin is list:
        return {"type": "array", "items": _type_schema(args[0], where)} if args else {"type": "array"}
    if origin is tuple:
        if not args:
            return {"type": "array"}
        if len(args) == 1 or ... in args:
            raise UnusableToolMethod(
                f"{where}: a one-element or variable-length tuple hint has no schema; use list[...]"
            )
        return {"type": "array", "prefixItems": [_type_schema(t, where) for t in args]}
    if origin is dict:
        out = {"type": "object"}
        if len(args) == 2:
            out["additionalProperties"] = _type_schema(args[1], where)
        return out
    return {"type": "object"}


def method_tool_spec(method: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """(description, parameters schema) of one tool method, by TRL's rules (module docstring).
    Raises `UnusableToolMethod` naming the method and what it lacks."""
    name = getattr(method, "__name__", "?")
    doc = inspect.getdoc(method)
    if not doc:
        raise UnusableToolMethod(
            f"method {name}() has no docstring (TRL builds the tool's description and "
            "argument descriptions from it)"
        )
    description, described = _docstring_parts(doc)
    try:
        hints = get_type_hints(method)
    except Exception as exc:  # noqa: BLE001 - a hint that does not resolve is named in one line
        raise UnusableToolMethod(
            f"method {name}(): its type hints do not resolve ({type(exc).__name__}: {exc})"
        ) from None
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(method).parameters.values():
        where = f"method {name}(), argument {param.name!r}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise UnusableToolMethod(f"method {name}(): *args / **kwargs cannot be tool arguments")
        if param.name not in hints:
            raise UnusableToolMethod(f"{where} has no type hint")
        if param.name not in described:
            raise UnusableToolMethod(f"{where} has no description in the docstring's Args: section")
        schema = _type_schema(hints[param.name], where)
        text = described[param.name]
        choices = _CHOICES.search(text)
        if choices:
            try:
                values = json.loads(choices.group(1))
            except ValueError:
                raise UnusableToolMethod(f"{where}: its (choices: ...) is not a JSON list") from None
            schema["enum"] = [v.strip() if isinstance(v, str) else v for v in values]
            text = text[: choices.start()].strip()
        schema["description"] = text
        properties[param.name] = schema
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return description, parameters


def validation_schema(schema: Any) -> Any:
    """`schema` with OpenAPI's ``"nullable": true`` read as JSON Schema ("null" is allowed too),
    for checking arguments; the model is offered `schema` itself."""
    if isinstance(schema, list):
        return [validation_schema(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: validation_schema(v) for k, v in schema.items() if not (k == "nullable" and isinstance(v, bool))
    }
    if schema.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out
