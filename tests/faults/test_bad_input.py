"""Bad input: one clear line naming the cause, exit code 2 where the run cannot go on, nothing lost.

Each case goes through the real command line (`collector.cli.main`, in process) or the real
job, the way a person meets it: an invalid config (wrong type, unknown field, negative
budget), a missing API-key variable, an unreachable base_url, an output path that cannot
be written, the output dir of another config, a corrupt shard in the output dir, an
environment module that fails to import. A tool that raises or hangs is not a reason to
stop: the episode gets an error result and goes on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest

from collector.cli import main
from collector.config import LoopConfig, RunConfig, load_config
from collector.envs.base import Environment, EpisodeWorld, Task, Tool
from collector.envs.toolkit import tool
from collector.episode.loop import EpisodeSpec, run_episode
from collector.errors import OutputError
from collector.providers.scripted import ScriptedProvider, call, calls, text
from collector.record.rows import Rows
from collector.run.job import run_job
from collector.run.plan import plan_work
from collector.stop import StopReason
from collector.storage import commit as commit_mod
from collector.storage.manifest import committed_shard_paths
from tests.checking import assert_run_checked, committed_ids
from tests.faults.cluster import free_port

BASE = """
name = "badinput"
[sweep]
models = ["sim-perfect"]
budgets = [256]
[env]
name = "arithmetic"
tasks = 3
[ray]
pool = "in_process"
workers = 1
episodes_in_flight = 4
cpus_per_worker = 0.5
[output]
path = "{run_dir}"
rows_per_shard = 2
"""


def write(tmp_path: Path, extra: str = "", base: str = BASE, run_dir: Path | None = None) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(base.format(run_dir=run_dir or tmp_path / "run") + extra)
    return path


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], *fragments: str) -> str:
    """Run the CLI; assert exit 2 and a single stderr line holding every fragment."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("collector: error: "), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


@pytest.mark.parametrize(
    ("edit", "fragments"),
    [
        (("workers = 1", 'workers = "two"'), ["ray.workers", "'two'"]),
        (("rows_per_shard = 2", "rows_per_shard = 2\nrows_per_shrad = 3"), ["output.rows_per_shrad", "xtra"]),
        (("budgets = [256]", "budgets = [256, -5]"), ["sweep.budgets.1", "-5"]),
    ],
    ids=["wrong-type", "unknown-field", "negative-budget"],
)
def test_invalid_config_is_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: tuple[str, str], fragments: list[str]
) -> None:
    """`collector run` on an invalid config exits 2 with one line naming the file and the field."""
    path = write(tmp_path, base=BASE.replace(*edit))
    one_line_error(capsys, ["run", str(path), "--quiet"], str(path), *fragments)
    assert not (tmp_path / "run").exists()


def test_missing_api_key_variable(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider whose key variable is unset stops the run before it starts, naming the variable."""
    monkeypatch.delenv("COLLECTOR_FAULTS_NO_KEY", raising=False)
    extra = ('\n[provider]\nkind = "chat"\nbase_url = "http://127.0.0.1:9/v1"\n'
             'api_key_env = "COLLECTOR_FAULTS_NO_KEY"\n')
    argv = ["run", str(write(tmp_path, extra)), "--quiet"]
    one_line_error(capsys, argv, "COLLECTOR_FAULTS_NO_KEY", "not set")


def test_unreachable_base_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A base_url nobody listens on is one line saying it is unreachable, before any episode runs."""
    port = free_port()  # bound and released: nothing listens there now
    extra = f'\n[provider]\nkind = "chat"\nbase_url = "http://user:hunter2@127.0.0.1:{port}/v1"\n'
    err = one_line_error(capsys, ["run", str(write(tmp_path, extra)), "--quiet"], "unreachable", str(port))
    assert "hunter2" not in err  # credentials in the URL are never printed
    assert not (tmp_path / "run").exists()


def test_output_path_that_cannot_be_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An output path under a regular file cannot be created: one line naming it, exit 2."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    path = write(tmp_path, run_dir=blocker / "run")
    one_line_error(capsys, ["run", str(path), "--quiet"], str(blocker / "run"))


def test_environment_module_that_fails_to_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An environment module raising at import is one line naming the module, exit 2."""
    (tmp_path / "broken_env_mod.py").write_text("import no_such_dependency_xyz\n")
    extra_env = f'name = "broken_env_mod:Env"\npython_path = ["{tmp_path}"]\n'
    path = write(tmp_path, base=BASE.replace('name = "arithmetic"\n', extra_env))
    one_line_error(capsys, ["run", str(path), "--quiet"], "broken_env_mod")


@pytest.mark.parametrize(
    ("edit", "fragments"),
    [
        (("budgets = [256]", 'budgets = ["64"]'), ["sweep.budgets.0", "'64'"]),
        (("[env]", 'seed = 18446744073709551616\n[env]'), ["seed", "18446744073709551616"]),
        (("[env]", "[provider]\nrequest_timeout_s = inf\n[env]"), ["provider.request_timeout_s", "finite"]),
        (("[env]", "providers = []\n[env]"), ["sweep.providers", "at least 1"]),
        (('name = "badinput"', 'name = ""'), ["name", "names the run directory"]),
        (('name = "badinput"', 'name = "bad\\ninput"'), ["name", "names the run directory"]),
        (("[ray]", "samples_per_task = 1000000000\n[ray]"), ["samples_per_task", "100000"]),
    ],
    ids=["string-budget", "seed-2**64", "inf-timeout", "no-providers", "empty-name", "newline-name",
         "samples"],
)
def test_values_that_pass_a_type_check_but_break_a_run_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: tuple[str, str], fragments: list[str]
) -> None:
    """`collector run` refuses each value that would break or exhaust a run, in one line, exit 2."""
    path = write(tmp_path, base=BASE.replace(*edit))
    one_line_error(capsys, ["run", str(path), "--quiet"], str(path), *fragments)
    assert not (tmp_path / "run").exists()


def test_a_name_that_climbs_out_of_runs_is_refused_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`name = "../../escaped"` with the default output path (runs/{name}) is refused before any
    directory is made: nothing appears outside runs/."""
    cwd = tmp_path / "work" / "here"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    config = cwd / "c.toml"
    config.write_text('name = "../../escaped"\n[sweep]\nmodels = ["sim-perfect"]\nbudgets = [256]\n')
    one_line_error(capsys, ["run", str(config), "--quiet"], "name", "../../escaped")
    one_line_error(capsys, ["validate", str(config)], "name", "../../escaped")
    assert not (tmp_path / "work" / "escaped").exists()
    assert not (cwd / "runs").exists()


@pytest.mark.parametrize("where", ["empty-dir", "missing", "a-file"])
def test_check_of_a_path_that_is_not_a_run_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """`collector check` on a directory without a manifest (or no directory) exits 2 with one line,
    not 1: nothing was checked, so no problem was found."""
    target = tmp_path / where
    if where == "empty-dir":
        target.mkdir()
    elif where == "a-file":
        target.write_text("x")
    one_line_error(capsys, ["check", str(target)], str(target), "not a run directory")


def test_a_cell_that_cannot_be_committed_never_blocks_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One (model, budget) cell whose shards cannot be written: every other cell is committed
    in the same run, the run ends with one line naming the uncommitted cell, and a rerun
    collects exactly that cell."""
    run_dir = tmp_path / "run"
    cfg = load_config(write(tmp_path), ["sweep.budgets=[128,256]"])
    real = commit_mod.shard_table

    def poisoned(chunk: Rows, rejected: dict[str, str]) -> tuple[pa.Table | None, Rows]:
        # The driver's commit of the workers' rows: one cell's shard cannot be built.
        if chunk[0].budget == 128:
            raise OverflowError("Python int too large to convert to C long")
        return real(chunk, rejected)

    monkeypatch.setattr(commit_mod, "shard_table", poisoned)
    with pytest.raises(OutputError) as info:
        run_job(cfg, show_progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert "3 episode(s) were not committed" in message, message
    assert "budget 128" in message, message
    planned = {item.episode_id: item for item in plan_work(cfg).items}
    committed = committed_ids(run_dir)
    assert {planned[i].budget for i in committed} == {256}
    assert len(committed) == 3
    monkeypatch.undo()
    again = run_job(cfg, show_progress=False)
    assert again.committed == 3
    counts = committed_ids(run_dir)
    assert set(counts) == set(planned)
    assert set(counts.values()) == {1}


def _rows_by_shard(run_dir: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in committed_shard_paths(run_dir)}


def test_output_dir_of_another_config_is_refused_and_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Running another config into a run dir is refused in one line; the committed data is untouched."""
    run_dir = tmp_path / "run"
    first = write(tmp_path)
    assert main(["run", str(first), "--quiet"]) == 0
    capsys.readouterr()
    before = _rows_by_shard(run_dir)
    assert before
    other = write(tmp_path, "\n[loop]\nmax_steps = 2\n")
    one_line_error(capsys, ["run", str(other), "--quiet"], str(run_dir))
    assert _rows_by_shard(run_dir) == before
    assert_run_checked(run_dir, allow_notes=False)


def test_corrupt_shard_is_quarantined_and_its_episodes_rerun(tmp_path: Path) -> None:
    """A corrupt committed shard is named in a warning, moved aside and re-run; other shards are kept."""
    run_dir = tmp_path / "run"
    cfg = RunConfig.model_validate({
        "name": "corrupt", "sweep": {"models": ["sim-perfect"], "budgets": [256]},
        "env": {"name": "arithmetic", "tasks": 6},
        "ray": {"pool": "in_process", "workers": 1, "episodes_in_flight": 4, "cpus_per_worker": 0.5},
        "output": {"path": str(run_dir), "rows_per_shard": 2},
    })
    run_job(cfg, show_progress=False)
    shards = _rows_by_shard(run_dir)
    assert len(shards) >= 2
    victim, *others = sorted(shards)
    Path(victim).write_bytes(b"\x00garbage, not an Arrow file" * 10)

    again = run_job(cfg, show_progress=False)
    assert any(Path(victim).name in w for w in again.warnings), again.warnings
    assert all("\n" not in w for w in again.warnings)
    assert again.committed == 2  # exactly the corrupt shard's episodes, re-run
    for path in others:
        assert Path(path).read_bytes() == shards[path]
    counts = committed_ids(run_dir)
    assert set(counts) == {item.episode_id for item in plan_work(cfg).items}
    assert set(counts.values()) == {1}
    assert_run_checked(run_dir)  # the quarantined file is a note, not a problem


# --- tools that raise or hang ------------------------------------------------------------


class _World(EpisodeWorld):
    def __init__(self) -> None:
        self._tools = (
            tool(self.explode, inline=True), tool(self.stall, timeout_s=0.2), tool(self.fine, inline=True)
        )

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    def explode(self, x: int) -> str:
        """Always fails."""
        raise RuntimeError(f"disk on fire at {x}")

    async def stall(self, x: int) -> str:
        """Never returns."""
        await asyncio.sleep(3600)
        return "unreachable"

    def fine(self, x: int) -> str:
        """Works."""
        return str(x * 2)

    def grade(self, final_text: str | None) -> float:
        return 1.0 if final_text == "done" else 0.0


class _Env(Environment):
    name = "faulty-tools"

    def tasks(self) -> Sequence[Task]:
        return [Task("t0", "use the tools")]

    def start(self, task: Task) -> EpisodeWorld:
        return _World()


def test_tool_that_raises_or_hangs_does_not_stop_the_episode() -> None:
    """A raising tool and a hanging one each get an error result naming the cause; the episode goes on."""
    provider = ScriptedProvider([
        calls(call("explode", {"x": 1}, id="c1"), call("stall", {"x": 2}, id="c2"),
              call("fine", {"x": 3}, id="c3")),
        text("done"),
    ])
    spec = EpisodeSpec(run_id="r", model="m", provider_kind="scripted", budget=64, task=_Env().tasks()[0])
    started = time.monotonic()
    episode = asyncio.run(run_episode(spec, provider, _Env(), LoopConfig(tool_timeout_s=5.0)))
    assert time.monotonic() - started < 60  # a guard against hanging, not a performance check
    assert episode.stop_reason is StopReason.DONE
    assert episode.reward == 1.0
    results = {m.call_id: m for m in episode.messages if m.role == "tool"}
    assert results["c1"].is_error
    assert "RuntimeError" in results["c1"].text
    assert results["c2"].is_error
    assert "time" in results["c2"].text.lower()
    assert not results["c3"].is_error
    assert results["c3"].text == "6"
