"""Data truth through `collector run` on the simulator: the served model recorded per turn, an
end-of-run table that hides nothing, and per-turn rates that show a call fitting under a
rambling answer (issue 15)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.analysis.tables import load_run
from collector.cli import main
from tests.loopback import serving
from tests.run.aliasing import aliasing_app
from tests.run.test_modelcheck import _config

SIM = """
name = "{name}"
{extra}
[sweep]
models = {models}
budgets = {budgets}
[env]
name = "arithmetic"
tasks = {tasks}
[ray]
pool = "in_process"
workers = 2
episodes_in_flight = 8
cpus_per_worker = 0.5
[output]
path = "{run}"
"""


def _sim_config(tmp_path: Path, name: str, models: str, budgets: str, tasks: int, extra: str = "") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(SIM.format(name=name, extra=extra, models=models, budgets=budgets, tasks=tasks,
                               run=tmp_path / name))
    return path


def test_an_aliasing_server_opted_in_is_recorded_as_what_answered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With provider.allow_model_alias the run goes on, and every turn records the model that answered."""
    with serving(aliasing_app("gemma3-270m")) as url:
        path = _config(tmp_path, url, '["my-model"]')
        argv = ["run", str(path), "--in-process", "--quiet", "--set", "provider.allow_model_alias=true"]
        assert main(argv) == 0
    capsys.readouterr()
    turns = load_run(tmp_path / "run", columns=["turns"]).column("turns").to_pylist()
    served = {t["response_model"] for episode in turns for t in episode}
    assert served == {"gemma3-270m"}


def test_end_of_run_table_hides_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two providers x max_steps = 1 on a flaky model: rows per provider, a max_steps column, retries."""
    extra = """[loop]
max_steps = 1
[[sweep.providers]]
kind = "sim"
label = "sim-chat"
[[sweep.providers]]
kind = "sim"
sim_transport = "anthropic"
label = "sim-anthropic"
"""
    path = _sim_config(tmp_path, "storm", '["sim-flaky"]', "[256]", 20, extra)
    assert main(["run", str(path), "--quiet", "--target", "50%"]) == 0
    captured = capsys.readouterr()
    assert "requests retried (" in captured.err  # the summary says what the rates went through
    lines = captured.out.splitlines()
    header = lines[0].split()
    assert header[:3] == ["provider", "model", "budget"]
    assert "max_steps" in header
    assert header[-1] == "retried"
    rows = [line for line in lines[2:] if line.startswith("sim-")]
    assert [r.split()[0] for r in rows] == ["sim-anthropic", "sim-chat"]
    assert all(" 100.0% " in r for r in rows)  # every episode ended max_steps, and the table says so
    assert "target: truncation at or under 50.0% of episodes" in captured.out
    assert "sim-anthropic, sim-flaky: budget 256 (measured 0.0%)" in captured.out


def test_per_turn_rates_show_the_call_fitting_under_a_rambling_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Episodes read 100% truncated at every budget; per turn, the call fits at 64 and every answer is cut."""
    path = _sim_config(tmp_path, "ramble", '["sim-rambler"]', "[8, 64]", 8)
    assert main(["run", str(path), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["stats", str(tmp_path / "ramble"), "--format", "json"]) == 0
    assert [r["truncation_rate"] for r in json.loads(capsys.readouterr().out)["rows"]] == [1.0, 1.0]
    assert main(["stats", str(tmp_path / "ramble"), "--per", "turn", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    rate = {(r["budget"], r["turn_kind"] or r["turn_index"]): r["cut_rate"] for r in rows}
    assert rate[(8, 0)] == 1.0  # at 8 tokens the call itself does not fit
    assert rate[(64, 0)] == 0.0  # at 64 it always does ...
    assert rate[(64, "answer")] == 1.0  # ... and the answer after the tool result never does
    assert main(["stats", str(tmp_path / "ramble"), "--per", "turn"]) == 0
    assert "turn" in capsys.readouterr().out.splitlines()[0]
