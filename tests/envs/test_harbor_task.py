"""The Harbor task reader: the own tasks read, bad directories refused in one line naming the task."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from collector.envs.harbor_task import read_task, read_tasks
from collector.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"


def copy_task(tmp_path: Path, name: str = "shell-steps") -> Path:
    target = tmp_path / name
    shutil.copytree(EXAMPLES / name, target)
    return target


def test_the_own_tasks_read_with_their_timeouts_and_resources() -> None:
    """A directory of task directories gives every task, with task.toml's timeouts and resources."""
    tasks = {t.name: t for t in read_tasks(EXAMPLES)}
    assert set(tasks) == {"shell-steps", "long-file", "verifier-hangs", "image-fails"}
    shell = tasks["shell-steps"]
    assert shell.agent_timeout_s == 120.0
    assert shell.verifier_timeout_s == 30.0
    assert shell.cpus == 1.0
    assert shell.memory_mb == 256
    assert shell.workdir == "/app"
    assert shell.instruction.startswith("A service expects a status file.")
    assert shell.has_solution
    assert tasks["verifier-hangs"].verifier_timeout_s == 1.0


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: (d / "tests" / "test.sh").unlink(), "harbor task shell-steps: tests/test.sh is missing"),
        (
            lambda d: (d / "task.toml").write_text("[agent]\ntimeout_secs = 3\n"),
            "unknown key agent.timeout_secs",
        ),
        (
            lambda d: (d / "task.toml").write_text("[agent]\ntimeout_sec = 'soon'\n"),
            "agent.timeout_sec must be a positive",
        ),
        (lambda d: (d / "task.toml").write_text("[agent\n"), "task.toml is not TOML"),
        (lambda d: (d / "task.toml").write_text("flavour = 1\n"), "unknown key 'flavour'"),
        (
            lambda d: (d / "task.toml").write_text("[environment]\nallow_internet = 'yes'\n"),
            "allow_internet must be true",
        ),
    ],
)
def test_a_broken_task_directory_is_one_line_naming_the_task(
    tmp_path: Path, edit: object, message: str
) -> None:
    """A missing file, a typo'd key or a wrong type is refused before any episode, naming task and cause."""
    task = copy_task(tmp_path)
    edit(task)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=message) as caught:
        read_task(task)
    assert "\n" not in str(caught.value)


def test_the_image_key_follows_the_environment_directory(tmp_path: Path) -> None:
    """An edited Dockerfile gets a new image key; an unchanged copy keeps it (the build cache's key)."""
    task = copy_task(tmp_path)
    before = read_task(task).content_key
    assert read_task(copy_task(tmp_path / "again")).content_key == before
    with (task / "environment" / "Dockerfile").open("a") as handle:
        handle.write("RUN true\n")
    assert read_task(task).content_key != before


def test_harbor_documented_fields_that_do_nothing_here_are_accepted(tmp_path: Path) -> None:
    """A public task's storage, GPU and metadata fields are read without refusing the task."""
    task = copy_task(tmp_path)
    (task / "task.toml").write_text(
        'schema_version = "1.1"\n[task]\nname = "org/x"\n[metadata]\nanything = [1, 2]\n'
        '[environment]\nstorage_mb = 10240\ngpus = 0\nmcp_servers = []\n[verifier.env]\nTOKEN = "t"\n'
    )
    read = read_task(task)
    assert read.verifier_env == {"TOKEN": "t"}
    assert read.metadata["anything"] == [1, 2]
