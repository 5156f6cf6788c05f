"""The error tree of `collector.errors` names every exception class the package defines, as
it is, and every `CollectorError` survives the pickling that carries it across Ray.

The classes are found in the source (an AST walk over collector/, nested classes included),
not in a list kept by hand, so a class added anywhere and left out of the tree turns this
red. collector/starter is left out: it links to examples/my_env, a user's package.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import pickle
import re
from pathlib import Path
from typing import Any

import pytest

import collector.errors as errors
from collector.errors import CollectorError

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "collector"
EXCLUDED = (PACKAGE / "starter",)

#: Constructor arguments for the classes whose __init__ is not Exception's (message,).
ARGS: dict[str, tuple[Any, ...]] = {
    "ProviderError": ("the provider refused the request", 429, 2.5),
    "ShardError": ("data/model=m/part-000001.arrow", "truncated record batch"),
    "CommitIncomplete": ("1 episode does not fit the schema; left out", 7, {"ep-3f2a"}),
}
PROVIDER_ERRORS = ("ProviderUnavailable", "ContextOverflow", "QuotaExhausted", "RequestRejected",
                   "ProtocolViolation")


def _base_name(node: ast.expr) -> str:
    """`Exception`, `httpx.HTTPError` -> the class's own name (the last component)."""
    return ast.unparse(node).rsplit(".", 1)[-1]


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if any(path.is_relative_to(e) for e in EXCLUDED):
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def exception_classes() -> dict[str, str]:
    """Every exception class defined under collector/: its name -> its module.

    A class is one when it derives from a builtin exception or another one found here; a
    top-level class deriving from a library's exception (whose name says nothing) is asked
    of the imported module itself."""
    defs: list[tuple[str, ast.ClassDef, bool]] = []
    for module, path in _modules().items():
        tree = ast.parse(path.read_text(), str(path))
        top = set(tree.body)
        defs += [(module, n, n in top) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    known = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
    found: dict[str, str] = {}
    for module, node, top_level in defs:
        if top_level:
            cls = getattr(importlib.import_module(module), node.name)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                found[node.name] = module
    grew = True
    while grew:
        grew = False
        for module, node, _ in defs:
            if node.name not in found and any(_base_name(b) in known | found.keys() for b in node.bases):
                found[node.name] = module
                grew = True
    return found


def tree_lines() -> list[tuple[int, str, str, str]]:
    """(depth, name, base in parentheses or "", module named or "") of each class line of the tree."""
    out = []
    for line in (errors.__doc__ or "").splitlines():
        # Only the literal blocks are indented; a description's continuation starts with "(".
        m = re.match(r"^    ([│├└─ ]*)([A-Za-z_]\w*)(?: \((\w+)\))?(\s.*)?$", line)
        if m is None:
            continue
        module = re.match(r"\s+([a-z_0-9]+(?:\.[a-z_0-9]+)+): ", m.group(4) or "")
        out.append((len(m.group(1)) // 4, m.group(2), m.group(3) or "", module.group(1) if module else ""))
    return out


def test_the_source_has_the_classes_the_walk_must_find() -> None:
    """The walk itself works: it finds classes of every kind of ancestry (builtin, package, nested)."""
    found = exception_classes()
    assert found["CollectorError"] == "collector.errors"
    assert found["ShardError"] == "collector.record.shards"  # through OutputError, another module
    assert found["Interrupted"] == "collector.run.signals"  # a KeyboardInterrupt, not an Exception
    assert "StopReason" not in found
    assert "RunStore" not in found


def test_the_error_tree_names_every_exception_class() -> None:
    """Every exception class under collector/ is in the tree of `collector.errors`' docstring."""
    named = {name for _, name, _, _ in tree_lines()}
    missing = sorted(set(exception_classes()) - named)
    assert not missing, f"exception classes missing from the tree in collector/errors.py: {missing}"
    stale = sorted(named - set(exception_classes()))
    assert not stale, f"the tree names classes that no longer exist: {stale}"


def test_the_tree_says_where_each_class_is_and_what_it_derives_from() -> None:
    """Indentation is the direct base in the CollectorError tree; the module named is the module."""
    found = exception_classes()
    parents: dict[int, str] = {}
    for depth, name, base, module in tree_lines():
        cls = getattr(importlib.import_module(found[name]), name, None)
        home = found[name].removeprefix("collector.")
        assert module == ("" if home == "errors" else home), name
        if cls is None:
            continue  # a nested class: named, with no module attribute to check
        if issubclass(cls, CollectorError):
            parents[depth] = name
            if depth:
                assert cls.__bases__[0].__name__ == parents[depth - 1], name
        else:
            assert depth == 0, name
            assert base == ("" if cls.__bases__[0] is Exception else cls.__bases__[0].__name__), name


def _collector_errors() -> list[type[CollectorError]]:
    out = []
    for name, module in sorted(exception_classes().items()):
        cls = getattr(importlib.import_module(module), name, None)
        if isinstance(cls, type) and issubclass(cls, CollectorError):
            out.append(cls)
    return out


def _args(cls: type[CollectorError]) -> tuple[Any, ...]:
    for klass in cls.__mro__:
        if klass.__name__ in ARGS:
            return ARGS[klass.__name__]
        if klass is Exception:
            break
        if "__init__" in vars(klass):
            pytest.fail(f"{cls.__name__} has its own __init__: give it representative arguments in ARGS")
    return (f"{cls.__name__}: one line naming what failed",)


@pytest.mark.parametrize("cls", _collector_errors(), ids=lambda c: c.__name__)
def test_every_collector_error_pickles_intact(cls: type[CollectorError]) -> None:
    """What a Ray worker raises reaches the driver as the same error: type, message, fields."""
    error = cls(*_args(cls))
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error)
    assert copy.args == error.args
    assert vars(copy) == vars(error)


def test_the_pickled_classes_are_every_collector_error() -> None:
    """The parametrization covers the whole tree under CollectorError (18 classes today)."""
    names = {c.__name__ for c in _collector_errors()}
    assert {"CollectorError", "OutputError", "CommitIncomplete", "ShardError", *PROVIDER_ERRORS} <= names
    assert len(names) == 25  # 18, and the seven typed sandbox causes (ImageBuildFailed, ...)
