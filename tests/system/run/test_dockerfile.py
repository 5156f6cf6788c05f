"""The Dockerfile's checkable parts: what it copies exists, and its default command is valid.

There is no Docker engine on these machines. Its install and run steps were exercised by
hand in a fresh venv (pip install of the copied context, then the default command with a
smaller sweep); this test keeps the file consistent with the repository as both change.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from collector.cli import build_parser
from collector.config import load_config

ROOT = Path(__file__).resolve().parents[3]
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


def test_dependencies_install_in_a_layer_before_the_source() -> None:
    """pyproject.toml alone is copied and its dependencies installed before any source is copied,
    so a code change does not reinstall Ray and pyarrow."""
    lines = [line for line in DOCKERFILE.splitlines() if re.match(r"^(COPY|RUN)\s", line)]
    assert lines[0] == "COPY pyproject.toml ./"
    assert lines[1].startswith("RUN ")
    assert "pip install -r" in DOCKERFILE.split("COPY README.md")[0]
    source = lines.index("COPY collector ./collector")
    assert all(not line.startswith("COPY") or "pyproject" in line for line in lines[:2])
    assert source > 1
    assert "pip install --no-deps ." in DOCKERFILE.split("COPY collector ./collector")[1]


def test_dependency_layer_lists_exactly_the_project_dependencies(tmp_path: Path) -> None:
    """The one-liner that writes requirements.txt in the image yields pyproject's dependencies and
    the mcp and cluster extras' (configs/mcp_demo.toml runs in the image; nodes run `ray start`)."""
    run = next(line for line in instruction("RUN") if "tomllib" in line)
    one_liner = re.search(r'python -c "(.+?)" \\?$', run) or re.search(r'python -c "(.+)"', run)
    assert one_liner is not None
    (tmp_path / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    out = subprocess.run([sys.executable, "-c", one_liner.group(1)], cwd=tmp_path, capture_output=True,
                         text=True, check=True)
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    extras = project["optional-dependencies"]
    assert out.stdout.split("\n")[:-1] == project["dependencies"] + extras["mcp"] + extras["cluster"]


def test_dockerignore_keeps_the_venv_and_runs_out_of_the_context() -> None:
    """The build context leaves out .venv (about 1.4 GB after scripts/test), runs/ and .git."""
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".venv", "runs", ".git"} <= ignored


def test_starter_files_the_package_links_to_are_copied() -> None:
    """collector/starter links to configs/, notebooks/ and examples/: the image copies all three,
    so `pip install .` inside it finds the files the wheel must carry."""
    copied = {line.split()[0] for line in instruction("COPY")}
    for link in (ROOT / "collector" / "starter").iterdir():
        if link.is_symlink():
            top = Path(os.readlink(link)).parts[2]
            assert top in copied, link
