"""docs/card.md's upload runs as written against a folder `collector card` made, and the Hub's
own card parser reads the card's header (the upload itself replaced by a stand-in: no network)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import DatasetCard, HfApi

from collector.cli import main
from collector.run.job import run_job
from tests.docblocks import REPO, all_blocks
from tests.run.helpers import small_config

PAGE = REPO / "docs" / "card.md"


def test_card_folder_uploads_as_the_docs_show(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's Python block uploads the card's folder; the Hub's parser reads the card's header."""
    run = tmp_path / "runs" / "demo"
    run_job(small_config(run), show_progress=False)
    monkeypatch.chdir(tmp_path)
    assert main(["card", "runs/demo", "-o", "release"]) == 0
    assert main(["export", "runs/demo", "release/episodes.parquet", "--format", "parquet"]) == 0
    uploaded: list[dict[str, Any]] = []
    monkeypatch.setattr(HfApi, "create_repo", lambda self, *a, **k: None)
    monkeypatch.setattr(HfApi, "upload_folder", lambda self, **k: uploaded.append(k))
    [block] = [b for b in all_blocks() if b.page == PAGE and b.lang == "python"]
    exec(compile(block.code, str(PAGE), "exec"), {})
    [call] = uploaded
    folder = Path(call["folder_path"])
    assert call["repo_type"] == "dataset"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "episodes.parquet"]
    card = DatasetCard.load(folder / "README.md")
    header = card.data.to_dict()
    assert header["configs"] == [{"config_name": "default", "data_files": "*.parquet"}]
    assert header["collector"]["episodes"] == 24
    assert main(["check", "runs/demo", "--card", "release/README.md"]) == 0
