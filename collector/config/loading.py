"""Loading a config: TOML files, `--set a.b=value` overrides, one-line `ConfigError`s.

Part of `collector.config` (import from there); tested in tests/test_config.py.
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from collector.config.models import _describe
from collector.config.run import RunConfig, check_run_config
from collector.errors import ConfigError


def parse_override(text: str) -> tuple[list[str], object]:
    """Split `a.b.c=value` into its field path and a value parsed as a TOML value.

    TOML gives lists, numbers, booleans and quoted strings their natural syntax
    (`sweep.budgets=[64,128]`, `loop.max_steps=4`, `name="x"`). A value that is not valid
    TOML is taken as a bare string, so `output.path=runs/x` works without quoting.
    """
    key, sep, raw = text.partition("=")
    path = [part.strip() for part in key.strip().split(".")]
    if not sep or not all(path):
        raise ConfigError(f"--set {text}: expected KEY=VALUE with a dotted key, e.g. sweep.budgets=[64,128]")
    raw = raw.strip()
    try:
        value: object = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return path, value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `a.b=value` override set (intermediate tables created)."""
    merged = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = merged
        for i, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(path[: i + 1])
                raise ConfigError(f"--set {text}: {where} is a value, not a table")
            node = child
        node[path[-1]] = value
    return merged


def _one_line(source: str, exc: ValidationError) -> str:
    """The first validation error as `source: field.path: message (got value)`."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = ".".join(str(part) for part in first["loc"]) or "(top level)"
    message = first["msg"]
    # A whole table as "the value" is noise (model-level checks); name scalars and lists only.
    if first["type"] != "missing" and not isinstance(first["input"], dict):
        message += f" (got {_describe(first['input'])})"
    more = f" [+{len(errors) - 1} more]" if len(errors) > 1 else ""
    return f"{source}: {loc}: {message}{more}".replace("\n", " ")


def config_from_dict(data: Mapping[str, Any], source: str = "<config>") -> RunConfig:
    """Validate a plain mapping into a RunConfig, or raise a one-line ConfigError naming `source`."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(source, exc)) from None


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a TOML config, apply `--set` overrides, validate.

    Every failure is a ConfigError whose message is one line naming the file, the field path
    and the bad value.
    """
    source = str(path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such config file") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        # TOML is UTF-8 by definition (tomllib decodes before parsing).
        raise ConfigError(f"{source}: not valid TOML: not UTF-8 text (byte {exc.start})") from None
    return check_run_config(config_from_dict(apply_overrides(data, overrides), source), source)

