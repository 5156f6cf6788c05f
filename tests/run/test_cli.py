"""The `collector` command line: thin wiring, one-line errors with exit code 2, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.cli import main
from tests.run.test_worker import free_port

GOOD = """
name = "clitest"
[sweep]
models = ["sim-terse", "sim-verbose"]
budgets = [32, 256]
[env]
name = "arithmetic"
tasks = 4
[ray]
workers = 2
episodes_in_flight = 8
cpus_per_worker = 0.5
[output]
path = "{run_dir}"
"""


def write_config(tmp_path: Path, text: str = GOOD) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text.format(run_dir=tmp_path / "run"))
    return path


def assert_one_line_error(err: str, *fragments: str) -> None:
    assert err.startswith("collector: error: ")
    assert err.count("\n") == 1
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


def test_validate_describes_the_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`validate` checks a config and prints the sweep's shape and episode count."""
    assert main(["validate", str(write_config(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "ok" in out
    assert "2 model(s) x 2 budget(s) x 4 task(s) x 1 sample(s) = 16 episodes" in out


def test_validate_bad_value_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad value is one stderr line naming file, field and value, with exit code 2."""
    path = write_config(tmp_path, GOOD.replace("[32, 256]", "[-5, 256]"))
    assert main(["validate", str(path)]) == 2
    assert_one_line_error(capsys.readouterr().err, f"{path}: sweep.budgets.0:", "(got -5)")


def test_bad_override_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A `--set` override is validated like the file and reported by field path."""
    assert main(["validate", str(write_config(tmp_path)), "--set", "ray.workers=0"]) == 2
    assert_one_line_error(capsys.readouterr().err, "ray.workers")


def test_unknown_environment_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An environment that cannot be found is a one-line error, not an ImportError traceback."""
    path = write_config(tmp_path)
    assert main(["validate", str(path), "--set", 'env.name="nowhere_pkg:Env"']) == 2
    assert_one_line_error(capsys.readouterr().err, "env.name")


def test_missing_config_and_run_dir_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Paths that do not exist give exit code 2 and one line, for configs and run dirs alike."""
    assert main(["validate", str(tmp_path / "nope.toml")]) == 2
    assert_one_line_error(capsys.readouterr().err, "nope.toml")
    assert main(["stats", str(tmp_path / "no-run")]) == 2
    assert_one_line_error(capsys.readouterr().err)


def test_run_with_missing_key_exits_2_before_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A key variable that is not set fails in one line naming it, before any episode runs."""
    args = ["--set", 'provider.kind="chat"', "--set", 'provider.base_url="http://127.0.0.1:9/v1"']
    args += ["--set", 'provider.api_key_env="COLLECTOR_SURELY_UNSET_KEY"']
    assert main(["run", str(write_config(tmp_path)), *args, "--quiet"]) == 2
    assert_one_line_error(capsys.readouterr().err, "COLLECTOR_SURELY_UNSET_KEY", "is not set")
    assert not (tmp_path / "run").exists()


def test_run_with_unreachable_provider_exits_2_before_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A base_url nobody listens on fails in one line before any episode (no Ray started)."""
    port = free_port()
    args = ["--set", 'provider.kind="chat"', "--set", f'provider.base_url="http://127.0.0.1:{port}/v1"']
    assert main(["run", str(write_config(tmp_path)), *args, "--quiet"]) == 2
    assert_one_line_error(capsys.readouterr().err, f"127.0.0.1:{port}/v1 is unreachable")
    assert not (tmp_path / "run").exists()


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_run_then_stats_show_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`run` prints the truncation table; `stats --format json`, `show` and `check` read the run."""
    path = write_config(tmp_path)
    run_dir = tmp_path / "run"
    assert main(["run", str(path), "--quiet", "--target", "5%"]) == 0
    captured = capsys.readouterr()
    assert "16/16 episodes committed" in captured.err
    assert "sim-verbose" in captured.out
    assert "truncat" in captured.out

    assert main(["stats", str(run_dir), "--format", "json", "--by", "model"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sum(row["episodes"] for row in data["rows"]) == 16

    from collector.data.analysis import load_run

    episode_id = load_run(run_dir, columns=["episode_id"]).column("episode_id")[0].as_py()
    assert main(["show", str(run_dir), episode_id]) == 0
    assert episode_id in capsys.readouterr().out

    assert main(["check", str(run_dir)]) == 0
    assert "ok" in capsys.readouterr().out
    assert main(["stats", str(run_dir), "--by", "no_such_column"]) == 2
    assert_one_line_error(capsys.readouterr().err, "no_such_column")


def test_sim_model_that_is_not_a_preset_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`validate` and `run` refuse a misspelt simulator model in one line listing the presets, before Ray."""
    path = write_config(tmp_path)
    bad = ["--set", 'sweep.models=["sim-terse", "sim-trese"]']
    assert main(["validate", str(path), *bad]) == 2
    err = capsys.readouterr().err
    assert_one_line_error(err, "sweep.models.1", "'sim-trese'", "sim-terse", "sim-verbose")
    assert main(["run", str(path), *bad, "--quiet"]) == 2
    assert_one_line_error(capsys.readouterr().err, "'sim-trese'", "sim-hidden-cut")
    assert not (tmp_path / "run").exists()


def test_stats_by_repeated_column_is_grouped_once() -> None:
    """`--by model,model` (or a column in two --by) groups by that column once."""
    from collector.cli import _by

    assert _by(["model,model"]) == ("model",)
    assert _by(["model, budget", "budget,stop_reason,model"]) == ("model", "budget", "stop_reason")
    assert _by(None) == ()  # the default grouping, decided by compute_stats (provider too when several)
