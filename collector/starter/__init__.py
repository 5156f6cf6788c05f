"""What ships with the package for a first run without the repository: the demo config, a
starter project (`collector init DIR`) and the analysis notebook.

The files are the repository's own (`configs/demo.toml`, `notebooks/`, `examples/my_env/`),
linked into this folder so that the wheel carries exactly what the repository runs; an
installed `collector` therefore runs `collector run --demo` and `collector init` from any
directory.

Tests: tests/system/test_packaging.py (the wheel's demo and `collector init`), tests/envs/test_loading.py.
"""

from __future__ import annotations

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
    user's edits.
    """
    root = Path(dest)
    targets = {
        root / "config.toml": None,
        root / "my_env": _files() / "my_env",
        root / "notebooks" / "truncation_analysis.ipynb": _files() / "truncation_analysis.ipynb",
    }
    taken = [str(p) for p in targets if p.exists()]
    if taken:
        raise ConfigError(f"collector init: {', '.join(taken)} already exists; choose an empty directory")
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.toml").write_text(STARTER_CONFIG, encoding="utf-8")
    shutil.copytree(_files() / "my_env", root / "my_env", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "notebooks").mkdir(exist_ok=True)
    shutil.copyfile(_files() / "truncation_analysis.ipynb", root / "notebooks" / "truncation_analysis.ipynb")
    return list(targets)
