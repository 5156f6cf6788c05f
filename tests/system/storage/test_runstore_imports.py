"""A local run never imports boto3 (checked in a fresh interpreter).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.storage.test_runstore import ROOT


def test_a_local_run_never_imports_boto3(tmp_path: Path) -> None:
    """boto3 is the s3 extra: a local run must not need (or pay for) it."""
    code = textwrap.dedent(
        f"""
        import sys
        from collector.storage.opening import open_run_store
        with open_run_store({str(tmp_path / "run")!r}, "fp", {{}}) as st:
            pass
        print("boto3" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
