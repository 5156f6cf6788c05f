"""The wheel is enough: installed outside the repository, `collector` runs the demo and `init`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The collector wheel, built offline from a clean copy of this checkout.

    A copy, because setuptools reuses a `build/` or `*.egg-info` left in the tree by an
    earlier build or the editable install: a wheel built in place can carry files the
    package data no longer names.
    """
    source = tmp_path_factory.mktemp("src") / "collector"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "runs", "__pycache__", ".*_cache", ".hypothesis"))
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--quiet", "-w", str(out), str(source)],
        check=True, capture_output=True, text=True,
    )
    (built,) = out.glob("collector-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv outside the repo with the wheel installed; dependencies come from this venv.

    Only the collector itself is installed from the wheel (offline, no index); its
    dependencies are made importable by a .pth line naming this interpreter's site-packages,
    which holds no copy of the collector (the dev install is editable), so every collector
    file the new venv imports comes from the wheel.
    """
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "_dev_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(wheel)],
                   check=True, capture_output=True, text=True)
    return venv


def _run(venv: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run([str(venv / "bin" / "collector"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


def test_wheel_contents(wheel: Path) -> None:
    """The wheel holds the demo config, the notebook and my_env as regular files."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("collector/starter/demo.toml", "collector/starter/truncation_analysis.ipynb",
                 "collector/starter/my_env/env.py", "collector/starter/my_env/__init__.py"):
        assert name in names
    assert (ROOT / "configs" / "demo.toml").read_bytes() == zipfile.ZipFile(wheel).read(
        "collector/starter/demo.toml")


def test_installed_collector_runs_the_demo_from_anywhere(installed: Path, tmp_path: Path) -> None:
    """`collector run --demo` works from a directory with no repository in sight."""
    out = _run(installed, ["run", "--demo", "--quiet", "--set", "env.options.num_tasks=2",
                           "--set", "sweep.budgets=[64]", "--set", "ray.workers=1"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "sim-terse" in out.stdout
    check = _run(installed, ["check", "runs/demo"], cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    code = "import collector; print(collector.__file__)"
    imported = subprocess.run([str(installed / "bin" / "python"), "-c", code],
                              capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert str(installed) in imported
    assert str(ROOT) not in imported


def test_init_writes_a_starter_project_that_runs(installed: Path, tmp_path: Path) -> None:
    """`collector init DIR` writes a config, an environment and the notebook; the config runs as is."""
    out = _run(installed, ["init", "proj"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    proj = tmp_path / "proj"
    assert (proj / "config.toml").is_file()
    assert (proj / "my_env" / "env.py").is_file()
    assert (proj / "notebooks" / "truncation_analysis.ipynb").is_file()
    again = _run(installed, ["init", "proj"], cwd=tmp_path)
    assert again.returncode == 2
    assert "already exists" in again.stderr
    assert again.stderr.count("\n") == 1
    # In process: what is tested is the project `init` writes, run by the installed collector.
    # The starter on Ray workers (its `python_path`) is tests/system/envs/test_init_process.py's,
    # and Ray workers importing the installed package test_installed_collector_runs_the_demo_from_anywhere's.
    run = _run(installed, ["run", "config.toml", "--quiet", "--in-process"], cwd=proj)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "sim-sloppy" in run.stdout
    assert _run(installed, ["check", "runs/starter"], cwd=proj).returncode == 0
