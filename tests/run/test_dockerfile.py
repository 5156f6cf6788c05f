"""The Dockerfile's checkable parts: what it copies exists, and its default command is valid.

There is no Docker engine on these machines. Its install and run steps were exercised by
hand in a fresh venv (pip install of the copied context, then the default command with a
smaller sweep); this test keeps the file consistent with the repository as both change.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from collector.cli import build_parser
from collector.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instruction(name: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(rf"^{name}\s+(.+)$", DOCKERFILE, re.MULTILINE)]


def test_base_image_is_python_311_slim() -> None:
    """The image builds on python:3.11-slim, the version the package supports."""
    assert instruction("FROM") == ["python:3.11-slim"]


def test_copied_paths_exist() -> None:
    """Every COPY source exists in the repository, so the build context is complete."""
    for line in instruction("COPY"):
        *sources, _dest = line.split()
        for source in sources:
            assert (ROOT / source).exists(), source


def test_default_command_runs_the_demo_config() -> None:
    """ENTRYPOINT + CMD parse as `collector run` on the shipped demo config, with a valid override."""
    entrypoint = json.loads(instruction("ENTRYPOINT")[0])
    cmd = json.loads(instruction("CMD")[0])
    assert entrypoint == ["collector"]
    args = build_parser().parse_args(cmd)
    assert args.command == "run"
    config = ROOT / Path(args.config).relative_to("/app")
    cfg = load_config(config, args.set)
    assert cfg.provider.kind == "sim"
    assert cfg.output.path == "/data/demo"
