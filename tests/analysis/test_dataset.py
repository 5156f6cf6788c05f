"""The run directory is a dataset: the README's one-liners, a chat template, and `collector export`.

One real run per format (the simulator, support-desk tasks that start with a system
prompt, a budget that cuts turns), collected once for the module. Every reader the README
names opens the run directory itself in one line, with nothing but the sidecars and
hidden leftovers a store keeps beside the data (a crash's temp file, a quarantined shard),
and counts exactly the manifest's rows. Hugging Face runs offline with its cache in tmp.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from collector.analysis.export import FORMATS, export_run
from collector.analysis.tables import load_run
from collector.cli import main
from collector.config import RunConfig
from collector.envs.loading import load_environment
from collector.record.chat import template_messages, template_tools
from collector.run.job import run_job
from collector.storage.manifest import QUARANTINE, QUARANTINE_SUFFIX, TMP_DIR, TMP_SUFFIX, read_manifest
from tests.checking import assert_run_checked

TEMPLATE = Path(__file__).with_name("chatml_tools.jinja")
SYSTEM = "You are the support desk of an online shop. Use the tools; never guess an order's state."


def _task_file(path: Path) -> Path:
    """Support-desk tasks whose prompt is a system message and the built-in user request."""
    tasks = load_environment("support_desk", {"num_tasks": 8}).tasks()
    with open(path, "w") as f:
        for task in tasks:
            assert isinstance(task.prompt, str)
            prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.prompt}]
            f.write(json.dumps({"id": task.id, "prompt": prompt}) + "\n")
    return path


def _config(run_dir: Path, fmt: str, task_file: Path) -> RunConfig:
    return RunConfig.model_validate({
        "name": f"dataset-{fmt}",
        "sweep": {"models": ["sim-terse", "sim-hidden-cut"], "budgets": [32, 192]},
        "env": {"name": "support_desk", "options": {"task_file": str(task_file)}},
        "ray": {"pool": "in_process", "workers": 2, "episodes_in_flight": 8, "batch_size": 8,
                "cpus_per_worker": 0.5},
        "output": {"path": str(run_dir), "format": fmt, "rows_per_shard": 5},
    })


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real run per format, with the hidden leftovers a store may keep beside the data."""
    root = tmp_path_factory.mktemp("dataset")
    task_file = _task_file(root / "tasks.jsonl")
    out = {}
    for fmt in ("arrow", "parquet"):
        run = root / fmt
        run_job(_config(run, fmt, task_file), show_progress=False)
        assert_run_checked(run, allow_notes=False)
        ext = ".arrow" if fmt == "arrow" else ".parquet"
        shard = next((run / "data").iterdir())
        # Named as the store names them: a crash's temp file, a shard moved aside on open.
        data = shard.read_bytes()
        (run / TMP_DIR / f"part-000999-deadbeef{ext}{TMP_SUFFIX}").write_bytes(data)
        (run / QUARANTINE).mkdir()
        (run / QUARANTINE / f"data__part-000998-0badf00d{ext}{QUARANTINE_SUFFIX}").write_bytes(data)
        assert_run_checked(run)  # notes only: nothing a reader sees
        out[fmt] = run
    return out


def manifest_rows(run: Path) -> int:
    return sum(int(e["rows"]) for e in read_manifest(run)["shards"])


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """`datasets`, offline, its cache under tmp (set before the import: it reads them then)."""
    home = tmp_path_factory.mktemp("hf")
    saved = {k: os.environ.get(k) for k in ("HF_HOME", "HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    os.environ.update(HF_HOME=str(home), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    import datasets

    datasets.disable_progress_bars()
    yield datasets
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value

def test_pandas_opens_both_formats(runs: dict[str, Path]) -> None:
    """`pd.read_parquet(run)` reads the run dir itself (an Arrow run through pyarrow): rows, budget int64."""
    parquet, arrow = runs["parquet"], runs["arrow"]
    for run, df in ((parquet, pd.read_parquet(parquet)),
                    (arrow, ds.dataset(arrow, format="ipc").to_table().to_pandas())):
        assert len(df) == manifest_rows(run) > 0
        assert df["budget"].dtype == "int64"
        assert df["episode_id"].is_unique


def test_polars_opens_both_formats(runs: dict[str, Path]) -> None:
    """polars scans `**/*.parquet` and `**/*.arrow` with hive_partitioning: the manifest's rows, typed."""
    parquet, arrow = runs["parquet"], runs["arrow"]
    for lf, run in ((pl.scan_parquet(f"{parquet}/**/*.parquet", hive_partitioning=True), parquet),
                    (pl.scan_ipc(f"{arrow}/**/*.arrow", hive_partitioning=True), arrow)):
        df = lf.select("episode_id", "model", "budget").collect()
        assert df.height == manifest_rows(run)
        assert df.schema["budget"] == pl.Int64
        assert df.schema["model"] == pl.String
        assert df["episode_id"].n_unique() == df.height


def test_duckdb_opens_a_parquet_run(runs: dict[str, Path]) -> None:
    """DuckDB's `read_parquet('<run>/**/*.parquet', hive_partitioning=1)` counts the manifest's rows."""
    run = runs["parquet"]
    ((count, ids),) = duckdb.sql(
        "select count(*), count(distinct episode_id) from "
        f"read_parquet('{run}/**/*.parquet', hive_partitioning=1)"
    ).fetchall()
    assert count == ids == manifest_rows(run)


def test_pyarrow_opens_both_formats(runs: dict[str, Path]) -> None:
    """`ds.dataset(run, partitioning="hive")` (format="ipc" for Arrow) reads the run dir: no type clash."""
    parquet, arrow = runs["parquet"], runs["arrow"]
    for run, dataset in ((parquet, ds.dataset(parquet, partitioning="hive")),
                         (arrow, ds.dataset(arrow, format="ipc", partitioning="hive"))):
        table = dataset.to_table(columns=["episode_id", "budget"])
        assert table.num_rows == manifest_rows(run)
        assert table.schema.field("budget").type == pa.int64()
        assert len(set(table.column("episode_id").to_pylist())) == table.num_rows


def test_hugging_face_opens_both_formats(runs: dict[str, Path], hf: Any) -> None:
    """`load_dataset("parquet"|"arrow", data_dir=run)`: one train split with the manifest's rows."""
    for builder, run in (("parquet", runs["parquet"]), ("arrow", runs["arrow"])):
        loaded = hf.load_dataset(builder, data_dir=str(run))
        assert list(loaded) == ["train"]
        assert loaded["train"].num_rows == manifest_rows(run)
        assert len(set(loaded["train"]["episode_id"])) == manifest_rows(run)

def _render(environment: Any, row: dict[str, Any]) -> str:
    template = environment.from_string(TEMPLATE.read_text())
    text: str = template.render(messages=template_messages(row["chat"]), tools=template_tools(row["tools"]),
                                add_generation_prompt=False)
    return text


def test_a_chatml_template_renders_every_episode_with_its_tools(runs: dict[str, Path]) -> None:
    """Every stored episode renders through a strict ChatML-with-tools template, tools, calls and results."""
    import jinja2

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    environment = jinja2.Environment(undefined=jinja2.StrictUndefined)
    environment.globals["raise_exception"] = raise_exception
    rows = load_run(runs["arrow"], columns=["episode_id", "system_prompt", "chat", "tools", "stop_reason",
                                            "messages"]).to_pylist()
    assert {r["stop_reason"] for r in rows} >= {"done", "length"}  # cut episodes are rendered too
    for row in rows:
        text = _render(environment, row)
        tools = template_tools(row["tools"])
        assert tools, row["episode_id"]
        assert all(t["function"]["name"] in text for t in tools), row["episode_id"]
        assert row["system_prompt"] == SYSTEM
        assert text.startswith(f"<|im_start|>system\n{SYSTEM}")
        calls = [c for m in row["chat"] for c in m["tool_calls"]]
        assert text.count("<tool_call ") == len(calls)
        for call in calls:
            json.loads(call["function"]["arguments"])  # an object a template can embed as is
            assert f'id="{call["id"]}"' in text
        results = [m for m in row["chat"] if m["role"] == "tool"]
        assert text.count("<tool_response ") == len(results) == len(calls)  # every call settled
        assert len(row["chat"]) == len(row["messages"])


def test_export_chat_jsonl_round_trips_through_load_dataset(
    runs: dict[str, Path], hf: Any, tmp_path: Path
) -> None:
    """`export --format chat-jsonl --where ...` writes messages + tools that load_dataset("json") reads."""
    run = runs["parquet"]
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(run), str(out), "--format", "chat-jsonl",
                 "--where", "trainable=true", "--where", "stop_reason=done", "--where", "budget>=192"]) == 0
    columns = ["episode_id", "stop_reason", "budget", "trainable", "chat", "tools"]
    want = load_run(run, columns=columns).to_pylist()
    want = [r for r in want if r["trainable"] and r["stop_reason"] == "done" and r["budget"] >= 192]
    assert want
    loaded = hf.load_dataset("json", data_files=str(out), split="train")
    assert loaded.num_rows == len(want)
    assert set(loaded.column_names) == {"messages", "tools"}
    first = json.loads(out.read_text().splitlines()[0])
    assert first["messages"][0] == {"role": "system", "content": SYSTEM}
    assert {m["role"] for m in first["messages"]} >= {"system", "user", "assistant", "tool"}
    got = sorted(json.dumps(json.loads(line), sort_keys=True) for line in out.read_text().splitlines())
    lines = [{"messages": template_messages(r["chat"]), "tools": template_tools(r["tools"])} for r in want]
    assert got == sorted(json.dumps(line, sort_keys=True) for line in lines)


def test_export_parquet_converts_an_arrow_run_for_every_parquet_reader(
    runs: dict[str, Path], hf: Any, tmp_path: Path
) -> None:
    """`export RUN out.parquet --format parquet` turns an Arrow run into one file load_dataset reads."""
    run = runs["arrow"]
    out = tmp_path / "episodes.parquet"
    assert export_run(run, out, "parquet", ["model=sim-terse"]) > 0
    loaded = hf.load_dataset("parquet", data_files=str(out), split="train")
    want = load_run(run, columns=["model"]).column("model").to_pylist().count("sim-terse")
    assert loaded.num_rows == want
    assert set(loaded["model"]) == {"sim-terse"}
    assert duckdb.sql(f"select count(*) from read_parquet('{out}')").fetchall() == [(want,)]


def test_export_formats_are_a_mapping() -> None:
    """The export formats are one mapping of name to writer, so a new format is one entry."""
    assert set(FORMATS) == {"chat-jsonl", "parquet", "atif"}
