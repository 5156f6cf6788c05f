"""What ships with the package for a first run without the repository: the demo config, a
starter project (`collector init DIR`) and the analysis notebook.

The files are the repository's own (`configs/demo.toml`, `notebooks/`, `examples/my_env/`),
linked into this folder so that the wheel carries exactly what the repository runs; an
installed `collector` therefore runs `collector run --demo` and `collector init` from any
directory.

Tests: tests/system/test_packaging.py (the wheel's demo and `collector init`), tests/envs/test_loading.py.
"""

from __future__ import annotations

import os
import shutil
from importlib import resources
from pathlib import Path

from collector.errors import ConfigError

__all__ = ["STARTER_CONFIG", "demo_config", "write_starter"]

#: The starter project's config: the example environment against the simulator, small enough
#: to run in seconds, with a preset that writes malformed arguments so both stop_on reasons show.
STARTER_CONFIG = """\
# A starter sweep: the example environment in my_env/ against the built-in simulated provider
# (no key, no network). Run it from this directory: `collector run config.toml`.
# Every section and field: `collector schema`, or collector/config.py.

name = "starter"
seed = 0

[provider]
kind = "sim"                      # a real provider: kind = "chat", base_url, api_key_env

[sweep]
models = ["sim-terse", "sim-sloppy"]   # simulator presets; real model names for real providers
budgets = [32, 64, 128]                # per-turn output-token caps

[env]
name = "my_env:environment"       # package.module:attr, found on python_path
python_path = ["."]

[loop]
stop_on = ["length", "malformed_tool_call"]
max_steps = 6

[output]
path = "runs/{name}"
"""


def _files() -> Path:
    return Path(str(resources.files(__name__)))


def demo_config() -> Path:
    """The path of the packaged demo config (the repository's configs/demo.toml)."""
    return _files() / "demo.toml"


def write_starter(dest: str | Path) -> list[Path]:
    """Write a starter project into `dest`: config.toml, my_env/ and the notebook.

    Refuses (one line) to overwrite anything that exists, so running it twice never loses a
    user's edits; a symlink counts as existing even when it dangles, and every file is created
    without following one, so a link planted in `dest` never sends a write outside it.
    """
    root = Path(dest)
    targets = {
        root / "config.toml": None,
        root / "my_env": _files() / "my_env",
        root / "notebooks" / "truncation_analysis.ipynb": _files() / "truncation_analysis.ipynb",
    }
    planted = [str(p) for p in (root / "notebooks",) if p.is_symlink()]
    if planted:
        raise ConfigError(f"collector init: {planted[0]} is a symlink; refusing to write through it")
    taken = [str(p) for p in targets if os.path.lexists(p)]
    if taken:
        raise ConfigError(f"collector init: {', '.join(taken)} already exists; choose an empty directory")
    root.mkdir(parents=True, exist_ok=True)
    _create_new(root / "config.toml", STARTER_CONFIG.encode("utf-8"))
    shutil.copytree(_files() / "my_env", root / "my_env", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "notebooks").mkdir(exist_ok=True)
    notebook = (_files() / "truncation_analysis.ipynb").read_bytes()
    _create_new(root / "notebooks" / "truncation_analysis.ipynb", notebook)
    return list(targets)


def _create_new(path: Path, data: bytes) -> None:
    """Create `path` holding `data`, refusing (one line) a path that exists or is a symlink.

    O_EXCL with O_NOFOLLOW closes the window between the check above and the write: a link
    planted meanwhile fails the create instead of being followed.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except FileExistsError as exc:
        raise ConfigError(f"collector init: {path} already exists; choose an empty directory") from exc
    with os.fdopen(fd, "wb") as out:
        out.write(data)
