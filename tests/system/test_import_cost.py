"""Importing the package root is cheap (measured in a fresh interpreter).
"""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_package_root_is_cheap() -> None:
    """`import collector` loads neither pyarrow nor ray: the re-exports are imported on first use."""
    code = ("import sys, collector; "
            "print(sorted(m for m in ('pyarrow', 'ray', 'pydantic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
