"""A logprob the server did not send is stored as NaN and printed as JSON null, never bare NaN.

Covers the commands that write stored turns as JSON: `show --format json`, `follow --format
jsonl` and `export --format atif` (collector.analysis.json_values).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from collector.analysis.json_values import dumps
from collector.cli import main
from collector.storage.local import LocalRunStore
from tests.record.factory import make_episode


def _strict(text: str) -> Any:
    """Parse as strict JSON: NaN, Infinity and -Infinity are refused, as jq and browsers do."""
    def refuse(constant: str) -> Any:
        raise AssertionError(f"not JSON: bare {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def nan_run(tmp_path: Path) -> tuple[Path, str]:
    """A run of one episode whose first turn has a logprob the server left out (stored NaN)."""
    ep = make_episode()
    ep.turns[0].output_logprobs = [-0.25, math.nan, -1.5]
    with LocalRunStore.open(tmp_path / "run", "fp", {}, "arrow", 10) as st:
        st.commit([ep])
    return tmp_path / "run", ep.episode_id


def _first_logprobs(row: dict[str, Any]) -> Any:
    return row["turns"][0]["output_logprobs"]


def test_show_json_writes_a_missing_logprob_as_null(
    nan_run: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`collector show --format json` is strict JSON with the missing logprob as null."""
    run, episode_id = nan_run
    assert main(["show", str(run), episode_id, "--format", "json"]) == 0
    assert _first_logprobs(_strict(capsys.readouterr().out)) == [-0.25, None, -1.5]


def test_follow_jsonl_writes_a_missing_logprob_as_null(
    nan_run: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Every line of `collector follow --format jsonl` is strict JSON, the missing logprob null."""
    run, _ = nan_run
    assert main(["follow", str(run), "--format", "jsonl"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    assert _first_logprobs(_strict(lines[0])["episode"]) == [-0.25, None, -1.5]


def test_atif_export_writes_a_missing_logprob_as_null(nan_run: tuple[Path, str], tmp_path: Path) -> None:
    """The ATIF export is strict JSON: the step's logprobs hold null where the server sent none."""
    run, _ = nan_run
    out = tmp_path / "episodes.atif.jsonl"
    assert main(["export", str(run), str(out), "--format", "atif"]) == 0
    text = out.read_text(encoding="utf-8")
    trajectory = _strict(text.splitlines()[0])
    logprobs = [step["metrics"]["logprobs"] for step in trajectory["steps"]
                if "logprobs" in (step.get("metrics") or {})]
    assert logprobs == [[-0.25, None, -1.5]]


def test_dumps_turns_every_non_finite_float_into_null() -> None:
    """NaN and both infinities become null at any depth; finite numbers and other values stay."""
    value = {"a": [1.0, math.nan, (math.inf, -math.inf)], "b": {"c": 2, "d": "NaN"}}
    assert _strict(dumps(value)) == {"a": [1.0, None, [None, None]], "b": {"c": 2, "d": "NaN"}}
