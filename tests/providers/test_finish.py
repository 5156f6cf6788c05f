"""The finish-reason table (`collector.providers.finish`), walked entry by entry through the
real adapters; and `abort`: re-sent, counted, bounded, never a turn."""

from __future__ import annotations

import json

import pytest

from collector.errors import ProviderError, ProviderUnavailable
from collector.providers.finish import FINISH_TABLE, UNKNOWN, Decision, decide, finish_class
from collector.turn import FinishClass
from tests.providers.conftest import MakeProvider, request


def _reply(wire: str, raw: str) -> bytes:
    """A minimal non-streamed text reply of `wire` finishing with `raw` (3 of 64 tokens)."""
    if wire == "chat":
        body: dict[str, object] = {
            "id": "chatcmpl-1", "object": "chat.completion", "model": "m-test",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                         "finish_reason": raw}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3},
        }
    elif wire == "anthropic":
        body = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m-test",
                "content": [{"type": "text", "text": "hi"}], "stop_reason": raw,
                "usage": {"input_tokens": 5, "output_tokens": 3}}
    elif wire == "gemini":
        body = {"candidates": [{"content": {"role": "model", "parts": [{"text": "hi"}]},
                                "finishReason": raw}],
                "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 3}}
    else:
        status, _, reason = raw.partition(":")
        body = {"id": "resp_1", "object": "response", "status": status, "model": "m-test",
                "incomplete_details": {"reason": reason} if reason else None,
                "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                            "content": [{"type": "output_text", "text": "hi", "annotations": []}]}],
                "usage": {"input_tokens": 5, "output_tokens": 3}}
    return json.dumps(body).encode()


_ENTRIES = [(wire, raw, decision) for wire, table in FINISH_TABLE.items() for raw, decision in table.items()]
_CLASS = {Decision.STOP: FinishClass.STOP, Decision.TOOL_CALLS: FinishClass.TOOL_CALLS,
          Decision.LENGTH: FinishClass.LENGTH, Decision.CONTENT_FILTER: FinishClass.CONTENT_FILTER,
          Decision.OTHER: FinishClass.OTHER}


def test_the_table_lists_what_each_wire_and_the_oss_servers_send() -> None:
    """Each value the module docstring names has an entry (a new server value is a decision)."""
    assert set(FINISH_TABLE["chat"]) == {"stop", "length", "tool_calls", "content_filter", "function_call",
                                         "abort", "error", "repetition"}
    assert {"end_turn", "stop_sequence", "tool_use", "max_tokens", "pause_turn", "refusal",
            "model_context_window_exceeded"} == set(FINISH_TABLE["anthropic"])
    assert {"STOP", "MAX_TOKENS", "SAFETY", "RECITATION", "MALFORMED_FUNCTION_CALL", "OTHER",
            "FINISH_REASON_UNSPECIFIED"} <= set(FINISH_TABLE["gemini"])
    assert {"completed", "incomplete:max_output_tokens", "incomplete:content_filter", "failed",
            "cancelled"} == set(FINISH_TABLE["responses"])
    assert decide("chat", "abort") is Decision.RETRY


@pytest.mark.parametrize(("wire", "raw", "decision"), [e for e in _ENTRIES if e[2] in _CLASS])
async def test_each_finishing_entry_gives_its_class(make: MakeProvider, wire: str, raw: str,
                                                    decision: Decision) -> None:
    """Through the adapter: the raw reason kept verbatim, the class the table says."""
    provider, _, _ = await make(wire, _reply(wire, raw))
    turn = await provider.complete(request())
    assert turn.finish_class is _CLASS[decision]
    if wire != "responses":
        assert turn.raw_finish_reason == raw


@pytest.mark.parametrize(("wire", "raw"), [(w, r) for w, r, d in _ENTRIES if d is Decision.ERROR])
async def test_error_entries_are_failures_retried_then_raised(make: MakeProvider, wire: str,
                                                              raw: str) -> None:
    """An in-band failure is never a turn: retried as a server error, then the call fails."""
    provider, recorder, _ = await make(wire, *[_reply(wire, raw)] * 3, retries=2)
    with pytest.raises(ProviderError) as info:
        await provider.complete(request())
    assert info.value.retries == ("5xx", "5xx")
    assert len(recorder.requests) == 3


@pytest.mark.parametrize("wire", sorted(FINISH_TABLE))
async def test_unknown_values_are_other_kept_raw(make: MakeProvider, wire: str) -> None:
    """A value the table does not list: `UNKNOWN` (other), kept raw, never stop or length."""
    raw = "incomplete:brand_new" if wire == "responses" else "brand_new_reason"
    assert decide(wire, raw) is UNKNOWN is Decision.OTHER
    provider, _, _ = await make(wire, _reply(wire, raw))
    assert (await provider.complete(request())).finish_class is FinishClass.OTHER


def test_retry_and_error_never_map_to_a_finish_and_stop_with_calls_is_tool_calls() -> None:
    assert finish_class("chat", "abort", False) is FinishClass.OTHER
    assert finish_class("chat", "stop", True) is FinishClass.TOOL_CALLS
    assert finish_class("nowire", "stop", False) is FinishClass.OTHER
    assert decide("chat", None) is UNKNOWN


@pytest.mark.parametrize("stream", [False, True])
async def test_abort_is_resent_and_counted(make: MakeProvider, stream: bool) -> None:
    """vLLM / SGLang `abort` (weights swapped): the same request again, cause `abort`."""
    from tests.providers.test_errors_retries import good

    aborted = _reply("chat", "abort")
    if stream:
        chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m-test",
                 "choices": [{"index": 0, "delta": {"content": "h"}, "finish_reason": "abort"}]}
        aborted = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
    provider, recorder, sleeps = await make("chat", aborted, aborted, good("chat", stream), stream=stream)
    turn = await provider.complete(request())
    assert turn.retries == ("abort", "abort")
    assert turn.finish_class is FinishClass.TOOL_CALLS
    assert turn.raw_finish_reason == "tool_calls"
    assert len(recorder.requests) == 3
    assert len(sleeps.waits) == 2
    assert recorder.requests[0].content == recorder.requests[2].content  # the same request


async def test_abort_past_the_retries_fails_the_call(make: MakeProvider) -> None:
    """Aborted every time: `ProviderUnavailable` (the episode is `error`), never a turn."""
    provider, recorder, _ = await make("chat", *[_reply("chat", "abort")] * 3, retries=2)
    with pytest.raises(ProviderUnavailable, match=r"^chat: request aborted by the server") as info:
        await provider.complete(request())
    assert info.value.retries == ("abort", "abort")
    assert len(recorder.requests) == 3


async def test_an_episode_whose_turn_is_always_aborted_ends_error(make: MakeProvider) -> None:
    """Through the loop: never `done`, never `length`; `error` with every abort counted."""
    from collector.config import LoopConfig
    from collector.episode.loop import EpisodeSpec, run_episode
    from collector.stop import StopReason
    from tests.episode.helpers import ToyEnv

    provider, _, _ = await make("chat", *[_reply("chat", "abort")] * 3, retries=2)
    env = ToyEnv()
    spec = EpisodeSpec("run", "model", "chat", 64, env.tasks()[0], env_name=env.name)
    episode = await run_episode(spec, provider, env, LoopConfig())
    assert episode.stop_reason is StopReason.ERROR
    assert episode.turns == []
    assert episode.retries == ["abort", "abort"]
    assert episode.error is not None
    assert episode.error.type == "ProviderUnavailable"
    assert (episode.policy_version_first, episode.policy_versions) == (None, 0)
