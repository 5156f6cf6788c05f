"""The chat-template view; version-2 shards and the earlier layout still read; export on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.analysis.stats import compute_stats
from collector.analysis.tables import load_run
from collector.cli import main
from collector.record import shards
from collector.record.chat import chat_messages, system_prompt, template_messages, tools_json
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from collector.turn import ToolSpec
from tests.record.factory import make_batch, make_episode


def test_a_cut_turn_is_kept_with_its_settling_results() -> None:
    """A cut turn stays in the chat as produced, a malformed call as "{}", then its settling error result."""
    ep = make_episode(StopReason.LENGTH)
    chat = chat_messages(ep.messages)
    assert [m.role for m in chat] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    cut, result = chat[4], chat[5]
    (call,) = cut.tool_calls
    assert (call.id, call.type, call.function.name, call.function.arguments) == ("call_2", "function",
                                                                                 "calculator", "{}")
    assert result.tool_call_id == "call_2"
    assert result.name == "calculator"
    assert result.content.startswith("not executed: cut by the output-token limit")
    assert json.loads(chat[2].tool_calls[0].function.arguments) == {"expression": "37 * 12 + 5"}
    assert system_prompt(ep.messages) == "You are a careful assistant."
    assert system_prompt(ep.messages[1:]) is None


def test_template_messages_drop_empty_keys_and_can_parse_arguments() -> None:
    """Stored rows become OpenAI-shaped dicts without null keys; parse_arguments gives objects."""
    ep = make_episode(StopReason.DONE)
    table = shards.episodes_to_table([_with_chat(ep)])
    (row,) = table.column("chat").to_pylist()
    plain = template_messages(row)
    assert plain[1] == {"role": "user", "content": ep.messages[1].text}
    assert plain[3] == {"role": "tool", "content": "449", "tool_call_id": "call_1", "name": "calculator"}
    assert plain[2]["tool_calls"][0]["function"]["arguments"] == '{"expression": "37 * 12 + 5"}'
    parsed = template_messages(row, parse_arguments=True)
    assert parsed[2]["tool_calls"][0]["function"]["arguments"] == {"expression": "37 * 12 + 5"}


def test_tools_are_stored_in_the_openai_function_format() -> None:
    """The tools column is the JSON list [{type: function, function: {name, description, parameters}}]."""
    spec = ToolSpec("calculator", "Evaluate an expression.", {"type": "object", "properties": {}})
    assert json.loads(tools_json([spec])) == [{"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an expression.",
        "parameters": {"type": "object", "properties": {}}}}]


def _with_chat(ep):  # type: ignore[no-untyped-def]
    ep.chat = chat_messages(ep.messages)
    ep.system_prompt = system_prompt(ep.messages)
    return ep


def test_version_2_shards_stay_readable(tmp_path: Path) -> None:
    """A shard written before the chat block (schema version 2) still loads, counts in stats and checks."""
    from collector.analysis.check import check_run

    run = tmp_path / "run"
    with LocalRunStore.open(run, "fp", {}, "arrow", 10) as st:
        st.commit(make_batch(4))
        entry = st.shards[0]
    path = run / entry["path"]
    table = shards.read_shard(path).drop_columns(list(shards.CHAT_COLUMNS))
    shards.write_shard(path, table.replace_schema_metadata({shards.SCHEMA_VERSION_KEY: b"2"}), "arrow")
    manifest_path = run / ".collector" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["shards"][0].pop("size")
    manifest["shards"][0].pop("checksum")
    manifest_path.write_text(json.dumps(manifest))
    assert load_run(run, columns=["episode_id", "reward"]).num_rows == 4
    assert compute_stats(run).episodes == 4
    report = check_run(run)
    assert report.ok, report.problems


@pytest.mark.parametrize("where", ["budget~3", "colour=red", "budget>=many", "stop_reason=finished",
                                   "model>a"])
def test_export_refuses_a_bad_filter_in_one_line(tmp_path: Path, where: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A --where that does not parse, names an unknown column or a bad value: one line, exit 2, no file."""
    run = tmp_path / "run"
    with LocalRunStore.open(run, "fp", {}, "arrow", 10) as st:
        st.commit(make_batch(2))
    out = tmp_path / "out.jsonl"
    assert main(["export", str(run), str(out), "--where", where]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert where in err
    assert not out.exists()


def test_export_refuses_an_unknown_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown --format is one line naming the formats there are."""
    run = tmp_path / "run"
    LocalRunStore.open(run, "fp", {}, "arrow", 10).close()
    assert main(["export", str(run), str(tmp_path / "x"), "--format", "csv"]) == 2
    assert "chat-jsonl, parquet" in capsys.readouterr().err


def test_a_run_dir_of_the_earlier_layout_is_read_not_continued(tmp_path: Path) -> None:
    """A run dir with manifest.json on top and Hive dirs loads, checks and exports; the store refuses it."""
    from collector.analysis.check import check_run
    from collector.analysis.export import export_run
    from collector.errors import OutputError
    from collector.storage.manifest import partition_dir

    run = tmp_path / "run"
    with LocalRunStore.open(run, "fp", {}, "parquet", 3) as st:
        st.commit(make_batch(4) + make_batch(2, budget=64, start=4))
    manifest = json.loads((run / ".collector" / "manifest.json").read_text())
    for entry in manifest["shards"]:  # rebuild what the earlier layout wrote
        old = partition_dir(entry["model"], entry["budget"]) + "/" + entry["path"].rsplit("/", 1)[-1]
        (run / old).parent.mkdir(parents=True, exist_ok=True)
        (run / entry["path"]).rename(run / old)
        entry["path"] = old
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / ".collector" / "config.resolved.json").rename(run / "config.resolved.json")
    for leftover in ("manifest.json", "run.lock", "tmp"):
        path = run / ".collector" / leftover
        path.rmdir() if path.is_dir() else path.unlink()
    (run / ".collector").rmdir()
    (run / "data").rmdir()
    assert load_run(run, columns=["episode_id"]).num_rows == 6
    assert compute_stats(run).episodes == 6
    report = check_run(run)
    assert report.ok, report.problems
    assert any("old run-dir layout" in n for n in report.notes)
    assert export_run(run, tmp_path / "all.parquet", "parquet") == 6
    with pytest.raises(OutputError, match="earlier run-dir layout"):
        LocalRunStore.open(run, "fp", {}, "parquet", 3)
