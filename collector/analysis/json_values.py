"""JSON that every reader parses: a stored NaN (a logprob the server did not send) becomes null.

A shard keeps a missing per-token logprob as NaN (`TurnRecord.output_logprobs`: the list
stays aligned with the tokens), and Python's `json.dumps` writes a NaN as a bare `NaN`,
which is not JSON: `jq`, JavaScript and strict parsers refuse the whole line. Every command
that prints or writes stored rows as JSON (`show --format json`, `episodes --format json`,
`follow --format jsonl`, the ATIF export) goes through `dumps`, which writes NaN and the
infinities as `null` and refuses (`allow_nan=False`) anything it missed rather than emit
non-JSON.

Tests: tests/analysis/test_json_null.py.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps", "finite_or_null"]


def finite_or_null(value: Any) -> Any:
    """`value` with every non-finite float, at any depth of dicts, lists and tuples, as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """`json.dumps` of `value` with NaN and the infinities written as null (strict JSON)."""
    return json.dumps(finite_or_null(value), allow_nan=False, **kwargs)
