"""Loading a config: TOML files, `--set a.b=value` overrides, one-line `ConfigError`s.

Part of `collector.config` (import from there). Tests: tests/test_config.py,
tests/envs/test_loading.py (paths relative to the config file).
"""

from __future__ import annotations

import copy
import difflib
import tomllib
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

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
    """The first validation error as `source: field.path: message (got value)`, with a
    `did you mean` for a key the table does not have."""
    errors = exc.errors(include_url=False)
    # A misspelt key first: it is the likeliest cause of the other errors (a required field
    # "missing" because it was spelt wrong), and the one a suggestion fixes.
    errors.sort(key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    loc = ".".join(str(part) for part in first["loc"]) or "(top level)"
    message = first["msg"]
    # A whole table as "the value" is noise (model-level checks); name scalars and lists only.
    if first["type"] != "missing" and not isinstance(first["input"], dict):
        message += f" (got {_describe(first['input'])})"
    if first["type"] == "extra_forbidden":
        message += _did_you_mean(first["loc"])
    more = f" [+{len(errors) - 1} more]" if len(errors) > 1 else ""
    return f"{source}: {loc}: {message}{more}".replace("\n", " ")


def _did_you_mean(loc: Sequence[int | str]) -> str:
    """`; did you mean `samples_per_task`?` for a misspelt key, from the fields that table has."""
    if not loc:
        return ""
    near = difflib.get_close_matches(str(loc[-1]), sorted(_fields_at(RunConfig, loc[:-1])), n=1)
    return f"; did you mean `{near[0]}`?" if near else ""


def _fields_at(model: type[BaseModel], path: Sequence[int | str]) -> set[str]:
    """The field names of every model that `path` (a validation error's location) may reach.

    A union (a provider's `kind` variants) contributes every member's fields; a list index or
    a union tag in the path is stepped over.
    """
    models = [model]
    for part in path:
        reached: list[type[BaseModel]] = []
        for m in models:
            field = m.model_fields.get(str(part))
            if field is None:
                reached.append(m)  # an index or a tag: the same models, one level in
                continue
            reached.extend(_models_in(field.annotation))
        models = reached
    return {name for m in models for name in m.model_fields}


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def config_from_dict(data: Mapping[str, Any], source: str = "<config>") -> RunConfig:
    """Validate a plain mapping into a RunConfig, or raise a one-line ConfigError naming `source`."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(source, exc)) from None


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a TOML config, apply `--set` overrides, validate.

    Paths in the file (`env.task_file`, `env.python_path`) are relative to the file's
    directory; paths given with `--set`, and `output.path`, to the working directory.

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
    data, written = _paths_from_file(data, Path(path).resolve().parent)
    cfg = config_from_dict(apply_overrides(data, overrides), source)
    if written is not None:
        cfg.env._task_file_written = written  # an override of task_file no longer matches it
    return check_run_config(cfg, source)


def _paths_from_file(data: dict[str, Any], root: Path) -> tuple[dict[str, Any], tuple[str, str] | None]:
    """`data` with `env.task_file` and `env.python_path` made absolute against `root` (the
    config file's directory) where they are relative, and (absolute, written) for the task
    file. Before the overrides: a `--set` path stays relative to the working directory."""
    env = data.get("env")
    if not isinstance(env, dict):
        return data, None
    env = dict(env)
    written = None
    task_file = env.get("task_file")
    if isinstance(task_file, str) and _relative(task_file):
        env["task_file"] = str(root / task_file)
        written = (env["task_file"], task_file)
    paths = env.get("python_path")
    if isinstance(paths, list):
        env["python_path"] = [str(root / p) if isinstance(p, str) and _relative(p) else p for p in paths]
    return {**data, "env": env}, written


def _relative(path: str) -> bool:
    # A URI (s3://...) or an absolute path is left as written.
    return bool(path) and "://" not in path and not Path(path).is_absolute()

