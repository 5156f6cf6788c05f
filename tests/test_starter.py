"""`collector init`: the starter project is written only inside its directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.cli import main


def test_init_refuses_a_planted_dangling_config_symlink(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dangling config.toml symlink planted in the target makes `collector init` refuse in one
    line and write nothing outside the directory."""
    proj = tmp_path / "proj"
    proj.mkdir()
    outside = tmp_path / "elsewhere" / "owned.toml"
    outside.parent.mkdir()
    (proj / "config.toml").symlink_to(outside)

    assert main(["init", str(proj)]) != 0

    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "config.toml" in err[0]
    assert not outside.exists()
    assert not (proj / "my_env").exists()


def test_init_refuses_a_planted_notebooks_symlink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A notebooks/ symlink to a directory elsewhere is refused, so the notebook is never written
    through it."""
    proj = tmp_path / "proj"
    proj.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (proj / "notebooks").symlink_to(elsewhere)

    assert main(["init", str(proj)]) != 0

    assert "symlink" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []
    assert not (proj / "config.toml").exists()


def test_init_writes_the_starter_into_an_empty_directory(tmp_path: Path) -> None:
    """In an empty directory `collector init` writes config.toml, my_env/ and the notebook."""
    proj = tmp_path / "proj"
    assert main(["init", str(proj)]) == 0
    assert (proj / "config.toml").read_text(encoding="utf-8").startswith("# A starter sweep")
    assert (proj / "my_env").is_dir()
    assert (proj / "notebooks" / "truncation_analysis.ipynb").stat().st_size > 0
