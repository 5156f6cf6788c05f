"""The Docker tests need a running daemon, which `bash scripts/system-setup` installs and starts:
without one they fail, saying so, rather than skip (a skip would hide a set-up that broke)."""

from __future__ import annotations

import subprocess

import pytest


@pytest.fixture(scope="session", autouse=True)
def _docker_daemon() -> None:
    done = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"no Docker daemon (scripts/system-setup starts one): {done.stderr[-400:]}"
