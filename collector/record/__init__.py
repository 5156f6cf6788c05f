"""The record format: what one finished episode becomes, and how it is encoded.

- `episode`: the episode record (`Episode`, its turns, messages, tool calls) and its ids;
- `shards`: the Arrow schema derived from the record, Episode <-> table, shard files;
- `chat`: the chat-template view of a transcript (`chat`, `tools`, `system_prompt` columns).

The episode loop builds records; the storage wing writes them; the analysis wing reads them.
This wing imports only the vocabulary (`collector.stop`, `collector.turn`, `collector.errors`).

Tests: tests/test_layout.py (what each wing may import).
"""
