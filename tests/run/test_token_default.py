"""Token ids by default: a default run feeds `trainer-view`, a run without ids says why, a
server that does not know the capture fields costs one refused request, and run directories
collected before the default changed keep their identity (the refused capture:
tests/providers/test_token_refusal.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.analysis.trainer import token_summary
from collector.cli import main
from collector.config import ProviderConfig, SamplingConfig, config_fingerprint
from collector.run.job import run_job
from tests.run.helpers import small_config


def test_capture_is_on_exactly_where_the_wire_carries_ids() -> None:
    """Unset, token capture is on for the Chat Completions wire (the simulator's default), off elsewhere."""
    unset = SamplingConfig()
    assert ProviderConfig().captures_token_ids(unset)
    assert ProviderConfig(kind="chat", base_url="http://127.0.0.1:1/v1").captures_token_ids(unset)
    for wire in ("responses", "anthropic", "gemini"):
        assert not ProviderConfig(kind="sim", sim_transport=wire).captures_token_ids(unset)
    assert not ProviderConfig().captures_token_ids(SamplingConfig(token_ids=False))
    insisted = SamplingConfig(token_ids=True)
    assert ProviderConfig(kind="sim", sim_transport="anthropic").captures_token_ids(insisted)


def test_default_run_feeds_the_trainer_view(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run with the default config captures ids on every turn, so `trainer-view` writes rows and exits 0."""
    run_dir = tmp_path / "run"
    run_job(small_config(run_dir), show_progress=False)
    summary = token_summary(run_dir)
    assert summary["turns"] > 0
    assert summary["turns_with_ids"] == summary["turns"]
    assert main(["trainer-view", str(run_dir), str(tmp_path / "view.parquet")]) == 0
    assert (tmp_path / "view.parquet").stat().st_size > 0


def test_trainer_view_without_ids_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`trainer-view` on a run collected without ids exits non-zero with one line naming the setting."""
    run_dir = tmp_path / "run"
    run_job(small_config(run_dir, sampling__token_ids=False), show_progress=False)
    out = tmp_path / "view.parquet"
    assert main(["trainer-view", str(run_dir), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "no token ids to train on" in err
    assert "sampling.token_ids" in err
    assert not out.exists()


def test_default_keeps_the_fingerprint_of_runs_collected_before() -> None:
    """A config that leaves token capture unset keeps the fingerprint it had when the default was off,
    so an existing run directory resumes; asking for ids explicitly keeps its own fingerprint too."""
    unset = small_config(Path("r"))
    off = small_config(Path("r"), sampling__token_ids=False)
    on = small_config(Path("r"), sampling__token_ids=True)
    assert config_fingerprint(unset) == config_fingerprint(off)
    assert config_fingerprint(on) != config_fingerprint(off)
