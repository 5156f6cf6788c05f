"""`collector validate-tasks`: broken Harbor tasks are found before a sweep, each named with its cause."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from collector.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"
ALWAYS_PASSES = "mkdir -p /logs/verifier\necho 1 > /logs/verifier/reward.txt\n"


def test_the_own_tasks_validate_with_the_broken_ones_named(capsys: pytest.CaptureFixture[str]) -> None:
    """The solvable tasks are ok; the image that does not build and the hanging verifier are named; exit 1."""
    assert main(["validate-tasks", str(EXAMPLES), "--backend", "local_no_isolation"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "shell-steps: ok" in lines
    assert "long-file: ok" in lines
    assert any(line.startswith("image-fails: oracle: ImageBuildFailed: task image-fails") for line in lines)
    assert any(line.startswith("verifier-hangs: untouched: VerifierTimeout") for line in lines)
    assert lines[-1] == "4 tasks, 2 broken"


@pytest.mark.parametrize(("file", "content", "problem"), [
    ("tests/test.sh", ALWAYS_PASSES, "shell-steps: an untouched sandbox scores 1, not 0"),
    ("solution/solve.sh", "echo nothing done\n",
     "shell-steps: the oracle (solution/solve.sh) scores 0, not 1"),
])
def test_a_verifier_that_passes_anything_or_an_oracle_that_fails_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], file: str, content: str, problem: str
) -> None:
    """A verifier rewarding an untouched sandbox, or an oracle the verifier fails, makes the task broken."""
    shutil.copytree(EXAMPLES / "shell-steps", tmp_path / "shell-steps")
    (tmp_path / "shell-steps" / file).write_text(content)
    assert main(["validate-tasks", str(tmp_path), "--backend", "local_no_isolation"]) == 1
    out = capsys.readouterr().out
    assert problem in out
    assert out.splitlines()[-1] == "1 tasks, 1 broken"
