"""Bad input answered with one line and a hint: config typos, `--where` filters, a config given
for a run directory, a config checked before the job's imports, the presets in the docs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from collector.cli import main
from collector.record.shards import STOP_REASONS
from collector.sim.presets import PRESETS
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from tests.record.factory import make_batch

CONFIG = """
name = "typo"
sample_per_task = 4
[sweep]
models = ["sim-terse"]
budgets = [64]
"""


@pytest.fixture
def typo_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG, encoding="utf-8")
    return path


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A committed run: 4 episodes at budget 64 (done, length) and 4 at 128."""
    path = tmp_path / "run"
    with LocalRunStore.open(path, "fp", {}, "arrow", 10) as st:
        st.commit(make_batch(4, budget=64, stops=(StopReason.DONE, StopReason.LENGTH)))
        st.commit(make_batch(4, budget=128, start=4))
    return path


def test_config_typo_names_the_field_it_meant(typo_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A misspelt key is refused in one line that suggests the field it was likely meant to be."""
    assert main(["validate", str(typo_config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "sample_per_task" in err
    assert "did you mean `samples_per_task`?" in err


def test_nested_typo_is_suggested_from_its_own_table(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A typo inside a table (and inside a provider variant) is matched against that table's fields."""
    path = tmp_path / "c.toml"
    path.write_text('[sweep]\nmodels = ["sim-terse"]\nbudgets = [64]\n[provider]\nkind = "chat"\n'
                    'base_url = "http://127.0.0.1:1/v1"\napi_kye_env = "K"\n', encoding="utf-8")
    assert main(["validate", str(path)]) == 2
    assert "provider.api_kye_env" in (err := capsys.readouterr().err)
    assert "did you mean `api_key_env`?" in err
    path.write_text(path.read_text(encoding="utf-8").replace("api_kye_env", "api_key_env"), encoding="utf-8")
    assert main(["validate", str(path), "--set", "ray.workerz=2"]) == 2
    assert "did you mean `workers`?" in capsys.readouterr().err


def test_run_reports_a_typo_before_importing_the_job(typo_config: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`collector run` checks the config before importing the job (pyarrow, Ray): a typo costs no start-up."""
    for heavy in ("collector.run.job", "ray"):
        monkeypatch.setitem(sys.modules, heavy, None)  # an import of either now raises ImportError
    assert main(["run", str(typo_config)]) == 2
    assert "did you mean `samples_per_task`?" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["episodes", "export"])
def test_an_unknown_stop_reason_is_refused_by_every_filtering_command(
        command: str, run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--where stop_reason=lenght` is a typo named with its fix, never an empty table with exit 0."""
    out = [str(tmp_path / "out.jsonl")] if command == "export" else []
    assert main([command, str(run), *out, "--where", "stop_reason=lenght"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "did you mean 'length'?" in err
    assert ", ".join(STOP_REASONS) in err
    assert not (tmp_path / "out.jsonl").exists()


def test_episodes_reads_exports_grammar(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`episodes` takes the comparisons and comma lists `export` takes, with the same meaning."""
    assert main(["episodes", str(run), "--where", "budget>=100", "--format", "json"]) == 0
    assert capsys.readouterr().out.count("\n") == 4
    assert main(["episodes", str(run), "--where", "stop_reason=length,max_steps", "--where", "budget<100",
                 "--format", "json"]) == 0
    assert capsys.readouterr().out.count('"length"') == 2
    assert main(["episodes", str(run), "--where", "stop_reasn=done"]) == 2
    assert "did you mean 'stop_reason'?" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["stats", "episodes", "check", "report", "follow"])
def test_a_config_given_for_a_run_says_so(command: str, typo_config: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A reader handed a config file (`collector stats config.toml`) says it was given a config."""
    assert main([command, str(typo_config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "is a run's config file, not a run directory" in err


def test_configuration_reference_lists_every_simulator_preset() -> None:
    """docs/configuration.md names every simulator preset with its behaviour (not a source file)."""
    page = (Path(__file__).parents[1] / "docs" / "configuration.md").read_text(encoding="utf-8")
    section = page.split("## Simulator presets", 1)[1]
    for name, preset in PRESETS.items():
        assert f"| `{name}` | {preset.description} |" in section
