"""`--where COLUMN OP VALUE`: the one row-filter grammar of every command that filters episodes.

`collector episodes`, `collector export` (and `list_episodes` from a notebook) read a filter
with this parser, so a filter that one command accepts means the same in the other and one
that one refuses the other refuses too.

Grammar: ``COLUMN OP VALUE`` with OP one of ``= == != > >= < <=``. ``=``/``==``/``!=`` take a
comma list (``stop_reason=done,max_steps``: any of them). COLUMN is any scalar column of the
shard schema (`filterable_columns`). The value is read as the column's type: a number for
``budget``/``reward``, ``true``/``false`` for booleans, one of the `StopReason` values for
``stop_reason``. A value outside a closed set (``stop_reason=lenght``) is refused rather than
matching nothing: an empty table with exit 0 reads as "no such episodes", the wrong answer.
Every refusal is one `ConfigError` line naming the filter. Tests: tests/test_one_line.py.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.dataset as ds

from collector.errors import ConfigError
from collector.record.shards import SCHEMA, STOP_REASONS

__all__ = ["filterable_columns", "parse_where", "where_filter"]

_WHERE = re.compile(r"^\s*([A-Za-z_]+)\s*(!=|>=|<=|==|=|>|<)\s*(.*?)\s*$")
_EQUALITY = ("=", "==", "!=")

#: Columns whose values form a closed set: a value outside it is a typo, never "no rows".
_ENUMS: dict[str, tuple[str, ...]] = {"stop_reason": STOP_REASONS}


def _kind(column: str) -> pa.DataType | None:
    """The scalar type a filter on `column` compares against (None: not filterable)."""
    try:
        typ = SCHEMA.field(column).type
    except KeyError:
        return None
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    if pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ):
        return typ
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return typ
    return None  # lists and structs (turns, messages, ...): nothing a one-value filter means


def filterable_columns() -> tuple[str, ...]:
    """The columns `--where` may test, in the schema's order."""
    return tuple(f.name for f in SCHEMA if _kind(f.name) is not None)


def _parser(column: str, kind: pa.DataType) -> Callable[[str], object]:
    if column in _ENUMS:
        choices = _ENUMS[column]

        def choice(value: str) -> str:
            if value not in choices:
                near = difflib.get_close_matches(value, choices, n=1)
                hint = f"did you mean {near[0]!r}? " if near else ""
                raise ValueError(f"{hint}{column} is one of {', '.join(choices)}")
            return value
        return choice
    if pa.types.is_boolean(kind):
        def boolean(value: str) -> bool:
            if value.lower() not in ("true", "false"):
                raise ValueError(f"{column} is true or false")
            return value.lower() == "true"
        return boolean
    if pa.types.is_integer(kind):
        return int
    if pa.types.is_floating(kind):
        return float
    return str


def parse_where(text: str) -> tuple[str, ds.Expression]:
    """One ``COLUMN OP VALUE`` filter: (the column it tests, a dataset expression)."""
    match = _WHERE.match(text)
    if match is None:
        raise ConfigError(f"--where {text!r}: expected COLUMN OP VALUE, e.g. stop_reason=done or budget>=64")
    column, op, raw = match.groups()
    kind = _kind(column)
    if kind is None:
        near = difflib.get_close_matches(column, filterable_columns(), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"--where {text!r}: cannot filter on {column!r}{hint}; "
                          f"choose from {', '.join(filterable_columns())}")
    parse = _parser(column, kind)
    many = op in _EQUALITY
    ordered = pa.types.is_integer(kind) or pa.types.is_floating(kind)
    if not many and not ordered:
        raise ConfigError(f"--where {text!r}: {column} takes = or !=")
    try:
        values = [parse(v.strip()) for v in raw.split(",")] if many else [parse(raw)]
    except ValueError as e:
        detail = str(e) if column in _ENUMS or pa.types.is_boolean(kind) else f"not a {kind} value"
        raise ConfigError(f"--where {text!r}: bad value {raw!r} ({detail})") from None
    field = ds.field(column)
    if column == "stop_reason":  # dictionary-encoded: compare its strings
        field = field.cast(pa.string())
    if many:
        expr = field.isin(values)
        return column, (~expr if op == "!=" else expr)
    value = values[0]
    comparisons: dict[str, Callable[[], ds.Expression]] = {
        ">": lambda: field > value, ">=": lambda: field >= value,
        "<": lambda: field < value, "<=": lambda: field <= value,
    }
    return column, comparisons[op]()


def where_filter(terms: Sequence[str]) -> tuple[ds.Expression | None, tuple[str, ...]]:
    """Every term ANDed: (the expression or None for no terms, the columns it tests)."""
    flt: ds.Expression | None = None
    columns: list[str] = []
    for text in terms:
        column, expr = parse_where(text)
        columns.append(column)
        flt = expr if flt is None else flt & expr
    return flt, tuple(dict.fromkeys(columns))
