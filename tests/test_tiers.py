"""The suite's two tiers (tests/conftest.py, docs/testing.md): the default tier starts no process,
so it stays fast by construction; what needs Ray or a child process lives in tests/system."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ProcessStartRefused

TESTS = Path(__file__).resolve().parent
SYSTEM = TESTS / "system"


def _default_tier_test_modules() -> list[Path]:
    this = Path(__file__).resolve()  # it names the fixture to look for it
    return sorted(p for p in TESTS.rglob("test_*.py") if SYSTEM not in p.parents and p != this)


def test_a_default_tier_test_cannot_start_a_process() -> None:
    """Every way a test would start a process (subprocess, os.system, fork, posix_spawn) is refused
    during a default-tier test, with a message naming the test and where it belongs."""
    with pytest.raises(ProcessStartRefused, match=r"test_tiers\.py::.* is in the default tier.*system/"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)
    with pytest.raises(ProcessStartRefused):
        os.system("true")
    with pytest.raises(ProcessStartRefused):
        os.posix_spawn("/bin/true", ["true"], dict(os.environ))
    with pytest.raises(ProcessStartRefused):
        os.fork()


def test_no_default_tier_module_asks_for_ray() -> None:
    """No test module outside tests/system imports Ray or asks for the session's Ray cluster (a job
    test runs its workers in process: `ray.pool = "in_process"`)."""
    offenders = []
    for path in _default_tier_test_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            imported = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name == "ray" or name.startswith("ray.") for name in imported):
                offenders.append(f"{path.relative_to(TESTS)}:{node.lineno} imports ray")
            if isinstance(node, ast.arg) and node.arg == "ray_cluster":
                offenders.append(f"{path.relative_to(TESTS)}:{node.lineno} asks for ray_cluster")
            if isinstance(node, ast.Constant) and node.value == "ray_cluster":
                offenders.append(f"{path.relative_to(TESTS)}:{node.lineno} uses ray_cluster")
    assert offenders == []


def test_every_marker_selects_a_test_and_no_pytest_internal_is_written() -> None:
    """The markers pyproject.toml declares are each used by some test (no marker that selects
    nothing), and no conftest writes a pytest internal (a `_`-prefixed attribute of an item)."""
    import tomllib

    config = tomllib.loads((TESTS.parent / "pyproject.toml").read_text(encoding="utf-8"))
    markers = [m.split(":")[0] for m in config["tool"]["pytest"]["ini_options"]["markers"]]
    sources = "\n".join(p.read_text(encoding="utf-8") for p in TESTS.rglob("*.py"))
    for marker in markers:
        assert f"pytest.mark.{marker}" in sources, f"marker {marker} is declared but selects nothing"
    for conftest in TESTS.rglob("conftest.py"):
        tree = ast.parse(conftest.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    assert not (isinstance(target, ast.Attribute) and target.attr.startswith("_")), (
                        f"{conftest.relative_to(TESTS)}:{node.lineno} writes {target.attr}")


def _module_scoped_fixtures(path: Path) -> list[str]:
    """The names of the fixtures `path` declares with `scope="module"`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and any(
                    k.arg == "scope" and isinstance(k.value, ast.Constant) and k.value.value == "module"
                    for k in decorator.keywords
                ):
                    found.append(node.name)
    return found


def test_every_system_module_with_a_module_fixture_runs_on_one_worker() -> None:
    """A system-tier module whose tests share a module-scoped fixture is listed in
    SHARED_SETUP_MODULES, so the tier's scheduler sends its tests to one xdist worker and the
    fixture (a demo run, a wheel, a cluster) is built once, not once a worker."""
    from tests.system.conftest import SHARED_SETUP_MODULES

    modules = [p for p in SYSTEM.rglob("test_*.py") if _module_scoped_fixtures(p)]
    sharing = {p.relative_to(TESTS.parent).as_posix() for p in modules}
    assert sharing, "no system module shares a module-scoped fixture: the check would check nothing"
    assert sharing - SHARED_SETUP_MODULES == set(), "list these in SHARED_SETUP_MODULES"
    assert SHARED_SETUP_MODULES - sharing == set(), "these modules no longer share a module-scoped fixture"
