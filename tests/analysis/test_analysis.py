"""Loading a run from Python, other readers of the same files, and the `show` transcript."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import duckdb
import pandas as pd
import polars as pl
import pyarrow.dataset as ds
import pytest

import collector.analysis as analysis
from collector.analysis import check, stats
from collector.analysis.stats import compute_stats
from collector.errors import OutputError
from collector.record import shards
from collector.stop import StopReason
from collector.storage import local as store
from collector.storage import manifest
from collector.storage.local import LocalRunStore
from collector.storage.manifest import committed_shard_paths
from tests.record.factory import make_batch, make_episode

S = StopReason
MIX = (S.DONE, S.DONE, S.LENGTH, S.MALFORMED_TOOL_CALL, S.ERROR)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same 40 episodes committed once as an Arrow run and once as a Parquet run."""
    out = {}
    for fmt in ("arrow", "parquet"):
        run = tmp_path_factory.mktemp(fmt) / "run"
        with LocalRunStore.open(run, "fp", {}, fmt, 7) as st:  # type: ignore[arg-type]
            st.commit(make_batch(20, model="m1", budget=64, stops=MIX))
            st.commit(make_batch(20, model="m2", budget=256, stops=(S.DONE, S.LENGTH, S.DONE, S.DONE)))
        out[fmt] = run
    return out


def expected_truncated(run: Path) -> dict[tuple[str, int], int]:
    return {(r["model"], r["budget"]): r["truncated"] + 0 for r in compute_stats(run).rows()}


def test_load_run_reads_committed_rows_and_projects(runs: dict[str, Path]) -> None:
    """load_run gives every committed episode once, with only the asked columns, filters applied."""
    for run in runs.values():
        table = analysis.load_run(run, columns=["episode_id", "model", "stop_reason"])
        assert table.num_rows == 40
        assert table.column_names == ["episode_id", "model", "stop_reason"]
        assert len(set(table.column("episode_id").to_pylist())) == 40
        only = analysis.load_run(run, columns=["model"], filter=ds.field("budget") == 256)
        assert set(only.column("model").to_pylist()) == {"m2"}


def test_truncation_table_equals_stats(runs: dict[str, Path]) -> None:
    """truncation_table is the stats table as Arrow, from a run dir or from a loaded table."""
    run = runs["arrow"]
    from_dir = analysis.truncation_table(run).to_pylist()
    from_table = analysis.truncation_table(analysis.load_run(run)).to_pylist()
    assert from_dir == from_table == compute_stats(run).rows()


def test_stop_reason_mix_shares(runs: dict[str, Path]) -> None:
    """The stop-reason mix counts each reason per group, and the shares of a group sum to 1."""
    mix = analysis.stop_reason_mix(runs["arrow"]).to_pylist()
    m1 = {r["stop_reason"]: r["episodes"] for r in mix if r["model"] == "m1"}
    assert m1 == {"done": 8, "length": 4, "malformed_tool_call": 4, "error": 4}
    assert sum(r["share"] for r in mix if r["model"] == "m2") == pytest.approx(1.0)


def test_pandas_reads_an_arrow_run(runs: dict[str, Path]) -> None:
    """pandas reads the Arrow IPC shards as Feather files and finds the same truncation counts."""
    run = runs["arrow"]
    df = pd.concat(pd.read_feather(p) for p in committed_shard_paths(run))
    assert len(df) == 40
    got = df.groupby(["model", "budget"])["is_truncated"].sum().to_dict()
    assert {k: int(v) for k, v in got.items()} == expected_truncated(run)


def test_polars_reads_an_arrow_run(runs: dict[str, Path]) -> None:
    """polars scans the run's IPC files (zstd) by glob and finds the same truncation counts."""
    run = runs["arrow"]
    lf = pl.scan_ipc(f"{run}/**/*.arrow", hive_partitioning=True)
    got = lf.group_by("model", "budget").agg(pl.col("is_truncated").sum()).collect()
    counts = {(r["model"], r["budget"]): r["is_truncated"] for r in got.iter_rows(named=True)}
    assert counts == expected_truncated(run)
    assert lf.select(pl.col("stop_reason").cast(pl.String)).collect().height == 40


def test_duckdb_reads_a_parquet_run(runs: dict[str, Path]) -> None:
    """DuckDB reads a Parquet run's files directly, and a loaded Arrow run in place, with the same counts."""
    run = runs["parquet"]
    rows = duckdb.sql(
        "select model, budget, sum(is_truncated::int) from "
        f"read_parquet('{run}/**/*.parquet', hive_partitioning=1)"
        " group by all"
    ).fetchall()
    assert {(m, b): t for m, b, t in rows} == expected_truncated(run)
    con = duckdb.connect()
    con.register("episodes", analysis.load_run(runs["arrow"], columns=["model", "budget", "is_truncated"]))
    rows = con.sql("select model, budget, sum(is_truncated::int) from episodes group by all").fetchall()
    assert {(m, b): t for m, b, t in rows} == expected_truncated(runs["arrow"])


def test_render_episode_shows_the_cut_and_what_ran(tmp_path: Path) -> None:
    """`show` prints the stop reason, the cut turn, which calls ran, and never an unparsed fragment."""
    ep = make_episode(S.LENGTH, budget=64)
    ep.messages[4].tool_calls[0].raw_fragment = '{"expression": "37 *'
    with LocalRunStore.open(tmp_path / "run", "fp", {}, "arrow", 10) as st:
        st.commit([ep, *make_batch(3, start=10)])
    text = analysis.render_episode(tmp_path / "run", ep.episode_id)
    assert f"episode {ep.episode_id}" in text
    assert "stop_reason length" in text
    assert "cut: finish_reason; discarded" in text
    assert "calculator [call_1]" in text
    assert "<executed>" in text
    assert "<malformed: 17 chars not parsed, not stored>  <not executed>" in text
    assert "not executed: cut by the output-token limit" in text
    # the fragment is a prefix of call_1's full arguments: it may appear that once, never on its own
    assert text.count('{"expression": "37 *') == text.count('{"expression": "37 * 12 + 5"}') == 1


def test_render_unknown_episode_is_one_line_error(runs: dict[str, Path]) -> None:
    """Asking for an id the run does not hold is a one-line OutputError."""
    with pytest.raises(OutputError, match="no committed episode 'nope'"):
        analysis.render_episode(runs["arrow"], "nope")


def test_get_episode_round_trips(runs: dict[str, Path]) -> None:
    """get_episode and load_episodes rebuild the committed Episode objects exactly."""
    want = make_batch(20, model="m1", budget=64, stops=MIX)[7]
    assert analysis.get_episode(runs["parquet"], want.episode_id) == want
    assert analysis.load_episodes(runs["arrow"], [want.episode_id]) == [want]


@pytest.mark.parametrize("module", [analysis, check, manifest, shards, stats, store])
def test_public_names(module: ModuleType) -> None:
    """Each data-side module's __all__ is non-empty, names only what exists, and holds its public API."""
    assert module.__all__
    assert all(hasattr(module, name) for name in module.__all__)
    assert {"load_run", "truncation_table", "render_episode"} <= set(analysis.__all__)
    assert {"LocalRunStore"} <= set(store.__all__)
    assert {"committed_shard_paths", "read_manifest"} <= set(manifest.__all__)
    assert {"check_run", "CheckReport"} <= set(check.__all__)
    assert {"compute_stats", "format_stats"} <= set(stats.__all__)


def test_show_names_invisible_turns_retries_and_the_served_model() -> None:
    """`collector show` says when a turn was invisible, which requests were retried, and who answered."""
    ep = make_episode(StopReason.MALFORMED_TOOL_CALL, model="gemma3-27om")
    ep.turns[0].retries = ["429", "5xx"]
    ep.turns[0].response_model = "gemma3-270m"
    ep.turns[1].invisible_output = True
    lines = analysis.render_transcript(ep).splitlines()
    turn0 = next(line for line in lines if line.startswith("   0  "))
    turn1 = next(line for line in lines if line.startswith("   1  "))
    assert "retried: 429,5xx" in turn0
    assert "answered by gemma3-270m" in turn0
    assert "invisible output" in turn1
