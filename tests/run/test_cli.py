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


def test_run_then_stats_show_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`run --in-process` prints the truncation table; `stats --format json`, `show` and `check` read
    the run."""
    path = write_config(tmp_path)
    run_dir = tmp_path / "run"
    assert main(["run", str(path), "--in-process", "--quiet", "--target", "5%"]) == 0
    captured = capsys.readouterr()
    assert "16/16 episodes committed" in captured.err
    assert "sim-verbose" in captured.out
    assert "truncat" in captured.out

    assert main(["stats", str(run_dir), "--format", "json", "--by", "model"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sum(row["episodes"] for row in data["rows"]) == 16

    from collector.analysis.tables import load_run

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


# --- bad input that used to be a traceback ---------------------------------------------------


def test_config_that_is_not_utf8_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A config file in Latin-1 is one line naming the file, exit 2, not a UnicodeDecodeError."""
    path = tmp_path / "latin1.toml"
    text = GOOD.format(run_dir=tmp_path / "run").replace('"clitest"', '"caf\xe9"')
    path.write_bytes(text.encode("latin-1"))
    assert main(["validate", str(path)]) == 2
    assert_one_line_error(capsys.readouterr().err, str(path), "not UTF-8")


def test_task_file_that_is_not_utf8_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A JSONL task file in Latin-1 is one line naming the field, the file and the line, exit 2."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b'{"prompt": "What is 2 + 2?"}\n' + '{"prompt": "Caf\xe9: 3 + 4?"}\n'.encode("latin-1"))
    args = ["--set", f'env.task_file="{tasks}"']
    assert main(["validate", str(write_config(tmp_path)), *args]) == 2
    assert_one_line_error(capsys.readouterr().err, "env.task_file", str(tasks), "line 2", "not UTF-8")


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("def broken(:\n", "syntax error"),
        ("raise RuntimeError('no database configured')\n", "RuntimeError: no database configured"),
        ("import sys\nsys.exit(0)\n", "sys.exit(0)"),
    ],
    ids=["syntax-error", "raises", "sys-exit-0"],
)
def test_env_module_that_fails_on_import_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str, fragment: str
) -> None:
    """An env module with a syntax error, that raises or calls sys.exit(0) on import: one line, exit 2."""
    name = f"cli_env_{tmp_path.name.replace('-', '_')}"  # unique: a module is imported once per process
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / f"{name}.py").write_text(source)
    args = ["--set", f'env.name="{name}:environment"', "--set", f'env.python_path=["{tmp_path / "mods"}"]']
    assert main(["run", str(write_config(tmp_path)), *args, "--quiet"]) == 2
    assert_one_line_error(capsys.readouterr().err, "env.name", name, fragment)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("port", "why"), [("99999", "out of range"), ("8o80", "not a number")])
def test_base_url_with_a_bad_port_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], port: str, why: str
) -> None:
    """A base_url port out of range or not a number is one line naming the URL and the port, exit 2."""
    args = ["--set", 'provider.kind="chat"', "--set", f'provider.base_url="http://127.0.0.1:{port}/v1"']
    assert main(["run", str(write_config(tmp_path)), *args, "--quiet"]) == 2
    assert_one_line_error(capsys.readouterr().err, "provider.base_url", f"port '{port}'", why)
    assert not (tmp_path / "run").exists()


# --- the parser: version, help, schema -------------------------------------------------------


def test_version_flag_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    """`collector --version` prints the package version and exits 0 (no command needed)."""
    from collector import __version__

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"collector {__version__}"


@pytest.mark.parametrize(
    ("command", "lines"),
    [
        ("run", ["CONFIG the run's TOML config file"]),
        ("validate", ["CONFIG the run's TOML config file"]),
        ("stats", ["RUN_DIR a run directory"]),
        ("check", ["RUN_DIR a run directory"]),
        ("episodes", ["RUN_DIR a run directory"]),
        ("show", ["RUN_DIR a run directory", "EPISODE_ID an episode id, or a unique prefix"]),
        ("sim", ["(default: 127.0.0.1)", "(default: 8787)", "(default: 0)"]),
    ],
)
def test_help_explains_positionals_and_sim_defaults(
    capsys: pytest.CaptureFixture[str], command: str, lines: list[str]
) -> None:
    """Every positional argument has a help line in `--help`, and `sim --help` shows its defaults."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse pads and wraps to the terminal
    for line in lines:
        assert line in out, out


def test_schema_prints_the_config_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    """`collector schema` prints RunConfig's JSON Schema: every top-level field, with descriptions."""
    from collector.config import RunConfig

    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema == RunConfig.model_json_schema()
    assert set(schema["properties"]) == set(RunConfig.model_fields)
    assert {"sweep", "provider", "env", "loop", "ray", "output"} <= set(schema["properties"])


# --- finding and reading episodes ------------------------------------------------------------


@pytest.fixture(scope="module")
def listed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 30 synthetic episodes: two models x two budgets, some cut by the cap."""
    from collector.stop import StopReason as S
    from collector.storage.local import LocalRunStore
    from tests.record.factory import make_batch

    run = tmp_path_factory.mktemp("listed") / "run"
    with LocalRunStore.open(run, "fp", {}, "arrow", 8) as store:
        store.commit(make_batch(10, model="m1", budget=64, stops=(S.DONE, S.LENGTH)))
        store.commit(make_batch(10, model="m1", budget=256, stops=(S.DONE,)))
        store.commit(make_batch(10, model="m2", budget=64, stops=(S.DONE, S.DONE, S.MALFORMED_TOOL_CALL)))
    return run


def test_episodes_lists_ids_filtered_by_column_model_and_budget(
    listed_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`episodes` lists committed ids; --where, --model, --budget narrow it, --limit caps it; json lines."""
    from collector.analysis.tables import load_run

    rows = load_run(listed_run, columns=["episode_id", "model", "budget", "stop_reason"]).to_pylist()
    assert main(["episodes", str(listed_run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["episode_id", "model", "budget"]
    assert {line.split()[0] for line in lines[1:]} == {r["episode_id"] for r in rows}

    args = ["episodes", str(listed_run), "--where", "stop_reason=length", "--model", "m1", "--budget", "64"]
    assert main([*args, "--format", "json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    wanted = ("m1", 64, "length")
    expected = {r["episode_id"] for r in rows if (r["model"], r["budget"], r["stop_reason"]) == wanted}
    assert {e["episode_id"] for e in listed} == expected
    assert len(expected) == 5
    assert all(e["stop_reason"] == "length" for e in listed)

    args = ["episodes", str(listed_run), "--where", "trainable=true", "--limit", "3", "--format", "json"]
    assert main(args) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    with pytest.raises(SystemExit) as refused:
        main(["episodes", str(listed_run), "--limit", "-1"])
    assert refused.value.code == 2
    assert "must be 0 or more" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("where", "fragment"),
    [
        ("no_such=1", "cannot filter on 'no_such'"),
        ("budget=lots", "'budget=lots': bad value 'lots'"),
        ("stop_reason", "COLUMN OP VALUE"),
    ],
)
def test_episodes_bad_filter_is_one_line(
    listed_run: Path, capsys: pytest.CaptureFixture[str], where: str, fragment: str
) -> None:
    """An unknown column, a value of the wrong type or a filter without `=`: one line, exit 2."""
    assert main(["episodes", str(listed_run), "--where", where]) == 2
    assert_one_line_error(capsys.readouterr().err, "--where", fragment)


def test_show_takes_a_unique_prefix_and_refuses_ambiguous_or_unknown(
    listed_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`show` accepts a unique id prefix; an ambiguous or unknown prefix is one line, exit 2."""
    from collector.analysis.tables import load_run

    ids = load_run(listed_run, columns=["episode_id"]).column("episode_id").to_pylist()
    target = ids[0]
    unique = next(target[:n] for n in range(1, len(target)) if [i[:n] for i in ids].count(target[:n]) == 1)
    assert main(["show", str(listed_run), unique]) == 0
    assert f"episode {target}" in capsys.readouterr().out

    shared = next(a[:1] for a in ids if sum(b.startswith(a[:1]) for b in ids) > 1)  # 30 ids, 16 first chars
    assert main(["show", str(listed_run), shared]) == 2
    assert_one_line_error(capsys.readouterr().err, f"prefix {shared!r} matches", "give more of the id")

    assert main(["show", str(listed_run), "zz-no-such-id"]) == 2
    assert_one_line_error(capsys.readouterr().err, "no committed episode 'zz-no-such-id'")


def test_show_json_is_the_stored_row(listed_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`show --format json` prints the episode's stored row, every column, for scripts."""
    from collector.analysis.tables import load_run
    from collector.record.shards import SCHEMA

    row = load_run(listed_run, columns=["episode_id", "messages"]).to_pylist()[0]
    assert main(["show", str(listed_run), row["episode_id"], "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert set(SCHEMA.names) <= set(shown)
    assert shown["episode_id"] == row["episode_id"]
    assert shown["messages"] == row["messages"]


def test_show_labels_few_shot_calls_as_part_of_the_prompt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A few-shot tool call of the prompt is shown as part of the prompt, not as a call never executed."""
    from collector.record.episode import MessageRecord, ToolCallRecord
    from collector.storage.local import LocalRunStore
    from tests.record.factory import make_episode

    episode = make_episode()
    args = '{"expression": "1 + 1"}'
    shot = ToolCallRecord(id="shot_1", name="calculator", arguments_json=args, status="ok")
    episode.messages[1:1] = [
        MessageRecord(role="user", text="What is 1 + 1?"),
        MessageRecord(role="assistant", text="", tool_calls=[shot]),
        MessageRecord(role="tool", text="2", call_id="shot_1", name="calculator"),
        MessageRecord(role="assistant", text="2"),
    ]
    run = tmp_path / "run"
    with LocalRunStore.open(run, "fp", {}, "arrow", 8) as store:
        store.commit([episode])
    assert main(["show", str(run), episode.episode_id]) == 0
    out = capsys.readouterr().out
    shot_line = next(line for line in out.splitlines() if "[shot_1]" in line)
    assert shot_line.endswith("<in the prompt>")
    assert "[assistant . prompt]" in out
    assert "[tool calculator . shot_1 . prompt]" in out
    model_call = next(line for line in out.splitlines() if "[call_1]" in line)
    assert model_call.endswith("<executed>")
