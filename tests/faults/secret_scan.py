"""Search a directory for planted secrets in what its files *say*, not only in their bytes.

Shards are zstd-compressed Arrow IPC or Parquet, so a secret inside one is not in the file's
raw bytes: a byte grep over a run directory cannot fail for a shard. Here every file that is
an Arrow IPC file or stream or a Parquet file (recognised by its magic bytes, whatever its
name: temporary and quarantined shards too) is decoded, and every value of every column,
nested lists and structs included, and the file's metadata are searched; every JSON file is
parsed and its strings searched (a JSON escape would hide a secret from a byte grep); every
other file (logs, the manifest, Ray's files) is searched as bytes and as text.

Token ids are text too: a stored id sequence decodes to what the model wrote and was shown,
so with a `decode` every list of ints under a column named `*token_ids` or `input_ids` (the
shards' turns, the trainer view) is decoded and searched as well. `SimTokenizer` is the
simulator's tokenizer (`collector.sim.tokenizer`: a token per run of `CHARS_PER_TOKEN`
characters, its id `collector.sim.tokens.piece_id`) with the vocabulary a real tokenizer
ships: every piece it encoded, so the ids it handed out decode back to their text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from collector.sim import tokens as sim_tokens
from collector.sim.tokenizer import CHARS_PER_TOKEN

Decode = Callable[[list[int]], str]

#: The simulated template's special ids (`collector.sim.tokens`) and how they decode.
SPECIALS = {
    sim_tokens.BEGIN: "<|begin|>", sim_tokens.SYSTEM: "<|system|>", sim_tokens.USER: "<|user|>",
    sim_tokens.ASSISTANT: "<|assistant|>", sim_tokens.TOOL: "<|tool|>", sim_tokens.END: "<|end|>",
    sim_tokens.CALL_OPEN: "<tool_call>", sim_tokens.CALL_CLOSE: "</tool_call>",
    sim_tokens.TOOL_DEF: "<|tool_def|>", sim_tokens.SPACE: "\n",
}  # fmt: skip
_ROLES = {"system": sim_tokens.SYSTEM, "user": sim_tokens.USER, "assistant": sim_tokens.ASSISTANT,
          "tool": sim_tokens.TOOL}


class SimTokenizer:
    """The simulator's tokenizer with a vocabulary: `encode` records each piece it gives an id,
    `decode` maps ids back (an id never handed out decodes to U+FFFD)."""

    def __init__(self) -> None:
        self.vocabulary: dict[int, str] = dict(SPECIALS)

    def encode(self, text: str) -> list[int]:
        ids = []
        for i in range(0, len(text), CHARS_PER_TOKEN):
            piece = text[i:i + CHARS_PER_TOKEN]
            token_id = sim_tokens.piece_id(piece)
            self.vocabulary.setdefault(token_id, piece)
            ids.append(token_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.vocabulary.get(i, "\ufffd") for i in ids)

    def render_prompt(self, messages: list[dict[str, Any]], tool_names: Iterable[str] = ()) -> list[int]:
        """A Chat Completions request's prompt as the simulated template renders it (role ids,
        content pieces, each call's opener, name, argument pieces and closer), then the
        generation prompt: what a server's `prompt_token_ids` would hold."""
        ids = [sim_tokens.BEGIN]
        for name in tool_names:
            ids += [sim_tokens.TOOL_DEF, *self.encode(name)]
        for message in messages:
            ids.append(_ROLES.get(str(message.get("role")), sim_tokens.USER))
            content = message.get("content")
            ids += self.encode(content if isinstance(content, str) else "")
            for call in message.get("tool_calls") or ():
                ids += self.output(call["function"]["name"], call["function"]["arguments"])
            ids.append(sim_tokens.END)
        return [*ids, sim_tokens.ASSISTANT]

    def output(self, name: str, arguments: str) -> list[int]:
        """One tool call's output ids: opener, name, argument pieces, closer."""
        return [sim_tokens.CALL_OPEN, *self.encode(name), *self.encode(arguments), sim_tokens.CALL_CLOSE]


def strings_in(value: Any) -> Iterator[str]:
    """Every string in a decoded value (dict keys included), at any depth."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, bytes):
        yield value.decode("utf-8", errors="replace")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from strings_in(key)
            yield from strings_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from strings_in(item)


def is_token_column(name: str) -> bool:
    """A column (or struct field) that holds token ids: the shards' `*token_ids`, the view's `input_ids`."""
    return name.endswith("token_ids") or name == "input_ids"


def token_texts(value: Any, decode: Decode) -> Iterator[str]:
    """The decoded text of every id list under a token column, at any depth."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and is_token_column(key) and isinstance(item, list):
                if all(isinstance(i, int) for i in item):
                    yield decode(item)
            else:
                yield from token_texts(item, decode)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from token_texts(item, decode)


def _table_strings(table: pa.Table, decode: Decode | None) -> Iterator[str]:
    metadata = table.schema.metadata or {}
    for key, item in metadata.items():
        yield key.decode("utf-8", errors="replace")
        yield item.decode("utf-8", errors="replace")
    rows = table.to_pylist()
    yield from strings_in(rows)
    if decode is not None:
        yield from token_texts(rows, decode)


def decoded_strings(path: Path, decode: Decode | None = None) -> tuple[str, Iterator[str]]:
    """(what kind of file `path` is, the strings it holds once decoded; token ids decoded
    with `decode` when given)."""
    data = path.read_bytes()
    if data.startswith(b"ARROW1"):
        return "arrow", _table_strings(ipc.open_file(pa.BufferReader(data)).read_all(), decode)
    if data.startswith(b"PAR1"):
        return "parquet", _table_strings(pq.read_table(pa.BufferReader(data)), decode)
    if data[:4] == b"\xff\xff\xff\xff":
        try:  # an Arrow IPC stream (no file magic): continuation marker, then the schema
            return "arrow-stream", _table_strings(ipc.open_stream(pa.BufferReader(data)).read_all(), decode)
        except pa.ArrowInvalid:
            pass
    text = data.decode("utf-8", errors="replace")
    if path.suffix == ".json":
        try:
            return "json", iter([text, *strings_in(json.loads(text))])
        except ValueError:
            pass
    return "bytes", iter([text, data.decode("latin-1")])


def leaks_in(root: Path, secrets: Iterable[str], decode: Decode | None = None) -> list[str]:
    """"path (kind): secret" for every secret found anywhere under `root`, decoded or raw
    (token ids too, with `decode`)."""
    wanted = [s for s in secrets if s]
    found = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        raw = path.read_bytes()
        kind, strings = decoded_strings(path, decode)
        seen = {s for s in wanted if s.encode() in raw}
        for text in strings:
            seen.update(s for s in wanted if s in text)
        found += [f"{path} ({kind}): {s}" for s in wanted if s in seen]
    return found
