"""Episode <-> Arrow conversion and the shard schema."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pytest

from collector.errors import OutputError
from collector.record import shards
from collector.record.episode import (
    SCHEMA_VERSION,
    ChatFunction,
    ChatMessage,
    ChatToolCall,
    Episode,
    MessageRecord,
    ToolCallRecord,
    TurnRecord,
)
from collector.stop import StopReason
from tests.record.factory import make_batch, make_episode


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_round_trip_through_a_file(tmp_path: Path, fmt: shards.ShardFormat) -> None:
    """Episode -> Arrow -> file -> Episode gives back equal episodes, for every stop reason and format."""
    episodes = make_batch(len(StopReason) * 2, stops=tuple(StopReason))
    episodes[0].graded_reward = None
    episodes[1].messages[2].tool_calls[0].raw_fragment = '{"expression": "37 *'
    path = tmp_path / f"x{shards.EXTENSIONS[fmt]}"
    shards.write_shard(path, shards.episodes_to_table(episodes), fmt)
    table = shards.read_shard(path)
    assert table.schema.equals(shards.SCHEMA, check_metadata=True)
    assert shards.episodes_from_table(table) == episodes


def test_schema_version_is_in_the_file_metadata(tmp_path: Path) -> None:
    """Both formats carry SCHEMA_VERSION in the file's schema metadata."""
    table = shards.episodes_to_table(make_batch(2))
    for fmt in ("arrow", "parquet"):
        path = tmp_path / f"x{shards.EXTENSIONS[fmt]}"
        shards.write_shard(path, table, fmt)  # type: ignore[arg-type]
        assert shards.schema_version_of(shards.read_shard(path).schema) == SCHEMA_VERSION


def test_stop_reason_uses_one_fixed_dictionary() -> None:
    """stop_reason is dictionary-encoded with every StopReason in order, whatever the batch holds."""
    col = shards.episodes_to_table(make_batch(3, stops=(StopReason.LENGTH,))).column("stop_reason")
    assert pa.types.is_dictionary(col.type)
    chunk = col.chunk(0)
    assert chunk.dictionary.to_pylist() == [r.value for r in StopReason]
    assert col.to_pylist() == ["length"] * 3


def test_derived_columns_are_computed_at_write() -> None:
    """is_truncated, counts and token totals equal the Episode properties, row by row."""
    episodes = make_batch(6, stops=tuple(StopReason))
    table = shards.episodes_to_table(episodes)
    for name in shards.DERIVED_COLUMNS:
        assert table.column(name).to_pylist() == [getattr(ep, name) for ep in episodes], name
    cut = make_episode(StopReason.LENGTH, budget=64)
    row = shards.episodes_to_table([cut]).to_pylist()[0]
    assert row["is_truncated"] is True
    assert row["wasted_output_tokens"] == 64


def test_every_record_field_has_a_column() -> None:
    """The schema follows the record dataclasses: every field of every struct becomes a column or child."""
    names = set(shards.SCHEMA.names)
    assert {f.name for f in dataclasses.fields(Episode)} <= names
    assert set(shards.DERIVED_COLUMNS) <= names
    turns = shards.SCHEMA.field("turns").type.value_type
    assert [turns.field(i).name for i in range(turns.num_fields)] == [
        f.name for f in dataclasses.fields(TurnRecord)
    ]
    msgs = shards.SCHEMA.field("messages").type.value_type
    assert [msgs.field(i).name for i in range(msgs.num_fields)] == [
        f.name for f in dataclasses.fields(MessageRecord)
    ]
    calls = msgs.field("tool_calls").type.value_type
    assert calls.num_fields == len(dataclasses.fields(ToolCallRecord))


def test_documented_columns_lead_in_order() -> None:
    """The first columns are the documented ones, in the documented order."""
    assert tuple(shards.SCHEMA.names[: len(shards.COLUMN_ORDER)]) == shards.COLUMN_ORDER


def test_optional_fields_are_nullable_and_required_are_not() -> None:
    """`X | None` record fields are nullable columns; plain fields are declared non-null."""
    assert shards.SCHEMA.field("graded_reward").nullable
    assert shards.SCHEMA.field("error").nullable
    assert not shards.SCHEMA.field("reward").nullable
    assert not shards.SCHEMA.field("episode_id").nullable


def test_arrow_type_map_rejects_unknown_annotations() -> None:
    """An annotation outside the explicit type map is an error naming it, not a silent guess."""
    with pytest.raises(TypeError, match="complex"):
        shards.arrow_type(complex)


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_reading_selected_columns(tmp_path: Path, fmt: shards.ShardFormat) -> None:
    """read_shard(columns=...) returns only those columns, with the schema's types."""
    path = tmp_path / f"x{shards.EXTENSIONS[fmt]}"
    shards.write_shard(path, shards.episodes_to_table(make_batch(4)), fmt)
    table = shards.read_shard(path, ["episode_id", "stop_reason"])
    assert table.schema.names == ["episode_id", "stop_reason"]
    assert table.schema.field("stop_reason").type == shards.STOP_REASON_TYPE
    assert table.num_rows == 4


def test_missing_column_is_an_error(tmp_path: Path) -> None:
    """Asking an Arrow shard for a column it lacks is a one-line OutputError naming file and column."""
    path = tmp_path / "x.arrow"
    shards.write_shard(path, shards.episodes_to_table(make_batch(1)), "arrow")
    with pytest.raises(OutputError, match=r"x\.arrow: no column 'nope'"):
        shards.read_shard(path, ["nope"])


def test_old_shard_without_a_new_field_still_loads() -> None:
    """A shard lacking a defaulted field (written before it existed) loads with the default."""
    table = shards.episodes_to_table(make_batch(2)).drop_columns(["worker"])
    assert all(ep.worker is None for ep in shards.episodes_from_table(table))


def _row_wise(episodes: list[Episode]) -> pa.Table:
    """The reference: every column through pyarrow's own row-wise converter, one dict per struct."""
    columns = {}
    for f in shards.SCHEMA:
        if f.name == "stop_reason":
            continue
        values = [getattr(ep, f.name) for ep in episodes]
        if values and dataclasses.is_dataclass(next((v for v in values if v is not None), None)):
            values = [None if v is None else dataclasses.asdict(v) for v in values]
        elif f.name in ("turns", "messages", "executed_tool_calls", "chat"):
            values = [[dataclasses.asdict(x) for x in v] for v in values]
        if f.name == "tools":
            columns[f.name] = pa.array(values, type=pa.string()).dictionary_encode()
        else:
            columns[f.name] = pa.array(values, type=f.type)
    indices = pa.array([shards.STOP_REASONS.index(ep.stop_reason.value) for ep in episodes], type=pa.int8())
    columns["stop_reason"] = pa.DictionaryArray.from_arrays(indices, pa.array(shards.STOP_REASONS))
    return pa.Table.from_arrays([columns[f.name] for f in shards.SCHEMA], schema=shards.SCHEMA)


def test_the_column_wise_build_equals_pyarrows_row_wise_conversion(tmp_path: Path) -> None:
    """Every stop reason, a null error struct beside a set one, nullable lists both null and
    set, token ids, a chat with tool calls: value for value what `pa.array` over dicts gives,
    and a Parquet writer takes it (it refuses nulls inside a non-nullable child of a null struct)."""
    episodes = [make_episode(stop, sample=i) for i, stop in enumerate(StopReason)]
    first = episodes[0]
    first.turns[0].retries = None
    first.turns[0].output_token_ids = [1, 2, 3]
    first.turns[0].output_logprobs = [-0.5, -0.25, 0.0]
    first.chat = [ChatMessage(role="assistant", content="", tool_calls=[
        ChatToolCall(id="c1", type="function", function=ChatFunction(name="f", arguments="{}"))])]
    assert any(ep.error is None for ep in episodes)
    assert any(ep.error is not None for ep in episodes)
    built = shards.episodes_to_table(episodes)
    built.validate(full=True)
    assert built.equals(_row_wise(episodes))
    assert shards.episodes_to_table([]).equals(_row_wise([]))
    shards.write_shard(tmp_path / "s.parquet", built, "parquet")
    assert shards.episodes_from_table(shards.read_shard(tmp_path / "s.parquet")) == episodes
