"""Token capture end to end: loop + chat adapter + simulator, streamed and not; the redaction rule."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import AsyncIterator

import httpx
import pytest

from collector.analysis.trainer import full_prompts, trainer_rows
from collector.config import LoopConfig
from collector.envs.support_desk import SupportDeskEnv
from collector.episode.loop import EpisodeSpec, run_episode
from collector.episode.tokens import common_prefix
from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint
from collector.providers.scripted import ScriptedProvider, call, calls, text
from collector.record.episode import Episode
from collector.record.shards import episodes_to_table
from collector.sim import tokens as sim_tokens
from collector.sim.app import create_app
from collector.stop import StopReason
from collector.turn import SamplingParams, Turn
from tests.episode.helpers import ToyEnv

ENV = SupportDeskEnv(num_tasks=12)
TOKENS = SamplingParams(token_ids=True, temperature=0.7)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(seed=3))) as c:
        yield c


async def collect(client: httpx.AsyncClient, model: str, budget: int, stream: bool, kind: str = "chat",
                  params: SamplingParams = TOKENS, **loop: object) -> list[Episode]:
    """One episode per support_desk task on the simulator."""
    endpoint = Endpoint(base_url_for(kind, "http://sim.test"), api_key="sk-sim", streaming=stream)
    provider = build_provider(kind, endpoint, client)
    out = []
    for task in ENV.tasks():
        spec = EpisodeSpec("tok", model, kind, budget, task, env_name=ENV.name, sampling=params)
        out.append(await run_episode(spec, provider, ENV, LoopConfig.model_validate(loop)))
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("budget", [24, 48, 256])
async def test_every_turn_stores_counted_ids_and_logprobs(client: httpx.AsyncClient, stream: bool,
                                                          budget: int) -> None:
    """Chat on the simulator: each turn keeps as many output ids and logprobs as the server counted."""
    episodes = await collect(client, "sim-terse", budget, stream)
    turns = [t for ep in episodes for t in ep.turns]
    assert turns
    assert all(ep.stop_reason is not StopReason.ERROR for ep in episodes)
    for t in turns:
        assert t.tokens_requested
        assert t.temperature == 0.7
        assert t.output_token_ids is not None
        assert t.output_logprobs is not None
        assert len(t.output_token_ids) == len(t.output_logprobs) == t.output_tokens
        assert t.token_counts_ok is True
        assert t.prompt_token_ids
    if budget == 24:
        assert any(t.discarded for t in turns)  # cut turns keep their ids too


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_prefix_consistency_faithful_versus_rerendering(client: httpx.AsyncClient,
                                                              stream: bool) -> None:
    """Every later turn is prefix-consistent on the faithful preset, and none is on the re-rendering one."""
    faithful = await collect(client, "sim-terse", 256, stream)
    later = [t for ep in faithful for t in ep.turns[1:]]
    assert later
    assert all(t.prefix_consistent is True for t in later)
    assert all(t.prompt_ids_offset and t.prompt_ids_offset > 0 for t in later)
    assert all(ep.turns[0].prefix_consistent is None for ep in faithful)
    assert all(t.drift_offset is None and t.drift_found_id is None for ep in faithful for t in ep.turns)
    rerendered = await collect(client, "sim-rerender", 256, stream)
    later = [t for ep in rerendered for t in ep.turns[1:]]
    assert later
    assert all(t.prefix_consistent is False for t in later)
    for ep in rerendered:
        rows = episodes_to_table([ep]).to_pylist()[0]["turns"]
        prompts = full_prompts(rows)
        for k, t in enumerate(ep.turns[1:], start=1):
            # The diagnostic names the first differing position and both ids at it: the
            # simulator's template inserts a whitespace id after a replayed assistant role.
            previous, prompt = prompts[k - 1], prompts[k]
            assert previous is not None
            assert prompt is not None
            before = previous + ep.turns[k - 1].output_token_ids  # type: ignore[operator]
            assert t.drift_offset == t.prompt_ids_offset == common_prefix(before, prompt) < len(before)
            assert t.drift_expected_id == before[t.drift_offset]
            assert t.drift_found_id == prompt[t.drift_offset] == sim_tokens.SPACE


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_real_template_drift_breaks_rerendered_episodes_into_pieces(client: httpx.AsyncClient,
                                                                           stream: bool) -> None:
    """sim-drift in re-render mode: later turns drift, so the trainer view has more than one
    row per multi-turn episode, each drift diagnosed at the first differing id."""
    episodes = await collect(client, "sim-drift", 256, stream)
    multi = [ep for ep in episodes if ep.num_turns > 1]
    assert multi
    assert all(ep.stop_reason is not StopReason.ERROR for ep in episodes)
    for ep in multi:
        assert all(t.token_counts_ok is True for t in ep.turns)
        assert all(t.prefix_consistent is False and t.drift_offset is not None for t in ep.turns[1:])
    view = trainer_rows(episodes_to_table(episodes).to_pylist(), "sequence")
    assert not view.skipped
    rows = Counter(r["episode_id"] for r in view.rows)
    assert all(rows[ep.episode_id] == ep.num_turns > 1 for ep in multi)


async def test_dropped_stream_ids_are_recorded_as_asked_not_returned(client: httpx.AsyncClient) -> None:
    """A server that drops ids in streams does not fail the run: turns say asked for, not returned."""
    for model in ("sim-stream-no-ids", "sim-sglang"):
        episodes = await collect(client, model, 256, True)
        for ep in episodes:
            assert ep.stop_reason is StopReason.DONE
            for t in ep.turns:
                assert t.tokens_requested is True
                assert t.output_token_ids is None
                assert t.prompt_token_ids is None
                assert t.tokens_withheld is False
                assert t.token_counts_ok is None


async def test_sglang_ids_are_read_per_choice(client: httpx.AsyncClient) -> None:
    """SGLang's per-choice prompt and output ids are stored, and its faithful history is prefix-consistent."""
    episodes = await collect(client, "sim-sglang", 256, False)
    for ep in episodes:
        assert all(t.prompt_token_ids and t.token_counts_ok for t in ep.turns)
    later = [t for ep in episodes for t in ep.turns[1:]]
    assert later
    assert all(t.prefix_consistent is True for t in later)


@pytest.mark.parametrize("kind", ["responses", "anthropic", "gemini"])
async def test_wires_without_ids_record_asked_not_returned(client: httpx.AsyncClient, kind: str) -> None:
    """On wires with no token ids the switch costs nothing: episodes finish, turns say not returned."""
    episodes = await collect(client, "sim-terse", 256, False, kind=kind)
    assert all(ep.stop_reason is StopReason.DONE for ep in episodes)
    assert all(t.tokens_requested and t.output_token_ids is None for ep in episodes for t in ep.turns)


async def test_llamacpp_ids_come_from_logprobs_entries(client: httpx.AsyncClient) -> None:
    """llama.cpp shape: output ids read off `logprobs.content[].id`, counted; no prompt ids."""
    for ep in await collect(client, "sim-llamacpp", 256, False):
        for t in ep.turns:
            assert t.output_token_ids is not None
            assert t.token_counts_ok is True
            assert t.prompt_token_ids is None
            assert t.prefix_consistent is None


async def test_refused_logprobs_in_streams_do_not_fail_the_run(client: httpx.AsyncClient) -> None:
    """llama.cpp refuses logprobs + tools + stream with a 400: the turn is asked again without them."""
    for ep in await collect(client, "sim-llamacpp", 256, True):
        assert ep.stop_reason is StopReason.DONE
        assert all(t.tokens_requested and t.output_token_ids is None for t in ep.turns)


async def test_capture_off_stores_no_ids(client: httpx.AsyncClient) -> None:
    """Without `token_ids` nothing is asked for and no id is stored."""
    for ep in await collect(client, "sim-terse", 256, False, params=SamplingParams()):
        for t in ep.turns:
            assert t.tokens_requested is False
            assert t.output_token_ids is None
            assert t.prompt_token_ids is None


def _with_ids(turn: Turn, prompt: list[int], out: list[int]) -> Turn:
    return dataclasses.replace(turn, token_ids=out, prompt_token_ids=prompt, logprobs=[-0.1] * len(out),
                               usage=dataclasses.replace(turn.usage, output_tokens=len(out)))


async def _scripted(arguments: dict[str, object], result_text: str = "done") -> Episode:
    env = ToyEnv()
    first = _with_ids(calls(call("refund", arguments)), [1, 2, 3], [10, 11, 12])
    second = _with_ids(text(result_text), [1, 2, 3, 10, 11, 12, 20], [30, 31])
    spec = EpisodeSpec("run", "model", "scripted", 64, env.tasks()[0], env_name=env.name,
                       sampling=SamplingParams(token_ids=True))
    return await run_episode(spec, ScriptedProvider([first, second]), env, LoopConfig())


async def test_ids_are_withheld_from_an_episode_that_held_a_secret() -> None:
    """Redaction rule: an episode whose history held a redacted value keeps no token ids (logprobs stay)."""
    clean = await _scripted({"order_id": "A-1", "amount": 5})
    assert [t.output_token_ids for t in clean.turns] == [[10, 11, 12], [30, 31]]
    assert clean.turns[1].prompt_ids_offset == 6
    assert clean.turns[1].prompt_token_ids == [20]
    assert clean.turns[1].prefix_consistent is True
    for secret in ({"order_id": "A-1", "amount": 5, "password": "hunter2"},):
        episode = await _scripted(secret)
        assert "hunter2" not in repr(episode.messages)  # the record's own redaction
        for t in episode.turns:
            assert t.tokens_withheld is True
            assert t.output_token_ids is None
            assert t.prompt_token_ids is None
            assert t.output_logprobs is not None
    in_text = await _scripted({"order_id": "A-1", "amount": 5}, result_text="done, api_key=sk-live-123")
    assert all(t.tokens_withheld and t.output_token_ids is None for t in in_text.turns)


CREDENTIAL = "sk-PLANTED-run-key-0123456789"


async def _scripted_turns(first: Turn, second: Turn, credentials: tuple[str, ...] = ()) -> Episode:
    """Two scripted turns with ids (a call, then an answer) on ToyEnv, the run given `credentials`."""
    env = ToyEnv()
    spec = EpisodeSpec("run", "model", "scripted", 64, env.tasks()[0], env_name=env.name,
                       sampling=SamplingParams(token_ids=True), credentials=credentials)
    first = _with_ids(first, [1, 2, 3], [10, 11, 12])
    second = _with_ids(second, [1, 2, 3, 10, 11, 12, 20], [30, 31])
    return await run_episode(spec, ScriptedProvider([first, second]), env, LoopConfig())


def _refund() -> Turn:
    return calls(call("refund", {"order_id": "A-1", "amount": 5}))


@pytest.mark.parametrize(
    ("case", "first", "second"),
    [
        # The run's key echoed in prose: no key beside it, only the credential scrub sees it.
        ("credential in prose", _refund(), text(f"done; you sent me {CREDENTIAL}")),
        # In a call's arguments, under an innocent key.
        ("credential in arguments", calls(call("refund", {"order_id": CREDENTIAL, "amount": 5})),
         text("done")),
        # In a tool result: the unknown-tool error quotes the name the model called.
        ("credential in a tool result", calls(call(CREDENTIAL, {})), text("done")),
        # A secret pair in the reasoning text only (the history never holds the raw reasoning).
        ("secret pair in reasoning",
         dataclasses.replace(_refund(), reasoning_text="use api_key=PLANTED-rk-77"), text("done")),
        # The run's key in a reasoning item only.
        ("credential in a reasoning item",
         dataclasses.replace(_refund(), reasoning_items=[{"type": "thinking", "thinking": f"key {CREDENTIAL}",
                                                          "signature": "sig"}]), text("done")),
    ],
)
async def test_ids_are_withheld_whenever_the_record_was_scrubbed(
    case: str, first: Turn, second: Turn
) -> None:
    """Every scrub the record gets (run credentials anywhere, reasoning text and items, tool
    results) withholds the episode's ids: they would decode to the text as sampled."""
    episode = await _scripted_turns(first, second, credentials=(CREDENTIAL,))
    assert CREDENTIAL not in repr(episode), case
    assert "PLANTED-rk-77" not in repr(episode), case
    assert [t.tokens_withheld for t in episode.turns] == [True, True], case
    assert all(t.output_token_ids is None and t.prompt_token_ids is None for t in episode.turns), case
    assert all(t.output_logprobs is not None for t in episode.turns), case


async def test_a_clean_record_of_a_run_with_credentials_keeps_its_ids() -> None:
    """The rule reads what was scrubbed, not what the run was given: nothing scrubbed, ids kept."""
    item = {"type": "thinking", "thinking": "refund", "signature": "s"}
    thinking = dataclasses.replace(_refund(), reasoning_text="refund the order, then say done",
                                   reasoning_items=[item])
    episode = await _scripted_turns(thinking, text("done"), credentials=(CREDENTIAL,))
    assert [t.tokens_withheld for t in episode.turns] == [False, False]
    assert [t.output_token_ids for t in episode.turns] == [[10, 11, 12], [30, 31]]


async def test_a_turn_without_usable_usage_is_stored_as_unknown_not_as_a_mismatch() -> None:
    """A server that reported no usable counts (LiteLLM's Gemini stream: all zeros): the turn is
    stored with `usage_known` false, and its ids are not called a count mismatch (which would
    drop the episode from training); a turn with real counts stays known and checked."""
    env = ToyEnv()
    first = _with_ids(calls(call("refund", {"order_id": "A1", "amount": 5})), [1, 2, 3], [10, 11, 12])
    unknown = dataclasses.replace(first.usage, input_tokens=0, output_tokens=0, known=False)
    first = dataclasses.replace(first, usage=unknown)
    second = _with_ids(text("done"), [1, 2, 3, 10, 11, 12, 20], [30, 31])
    spec = EpisodeSpec("run", "model", "scripted", 64, env.tasks()[0], env_name=env.name,
                       sampling=SamplingParams(token_ids=True))
    ep = await run_episode(spec, ScriptedProvider([first, second]), env, LoopConfig())
    assert [t.usage_known for t in ep.turns] == [False, True]
    assert [t.token_counts_ok for t in ep.turns] == [None, True]
    assert ep.turns[0].output_token_ids == [10, 11, 12]


@pytest.mark.parametrize(
    ("raw", "stop", "returned", "counted", "ok", "uncounted"),
    [
        # llama.cpp, measured: a call turn ended on "</tool_call>" counts 36, returns 31 ids.
        ("tool_calls", ["</tool_call>"], 31, 36, True, 5),
        ("stop", ["</tool_call>"], 31, 36, True, 5),
        ("tool_calls", ["</tool_call>"], 31, 31 + 12, True, 12),  # the bound: 12 bytes
        ("tool_calls", ["</tool_call>"], 31, 31 + 13, False, None),  # more than any tokenizer makes of it
        ("tool_calls", None, 31, 36, False, None),  # no stop string asked: a real mismatch
        ("length", ["</tool_call>"], 31, 36, False, None),  # a cap, not a stop string
        ("tool_calls", ["</tool_call>"], 36, 36, True, None),
    ],
)
async def test_stop_string_tokens_counted_but_not_returned(
        raw: str, stop: list[str] | None, returned: int, counted: int, ok: bool, uncounted: int | None,
) -> None:
    """The stop-string rule: a turn that ended on a stop string the server counted and did not
    return is counted ok, its shortfall stored; the trainer view keeps it, mask on its ids only."""
    env = ToyEnv()
    out = list(range(100, 100 + returned))
    first = _with_ids(calls(call("refund", {"order_id": "A1", "amount": 5})), [1, 2, 3], out)
    first = dataclasses.replace(first, raw_finish_reason=raw,
                                usage=dataclasses.replace(first.usage, output_tokens=counted))
    second = _with_ids(text("done"), [1, 2, 3, *out, 20], [30, 31])
    spec = EpisodeSpec("run", "model", "scripted", 64, env.tasks()[0], env_name=env.name,
                       sampling=SamplingParams(token_ids=True, stop=stop))
    ep = await run_episode(spec, ScriptedProvider([first, second]), env, LoopConfig())
    assert ep.turns[0].token_counts_ok is ok
    assert ep.turns[0].stop_tokens_uncounted == uncounted
    view = trainer_rows(episodes_to_table([ep]).to_pylist(), "sequence")
    if not ok:
        assert view.skipped == {"count_mismatch": 1}
        return
    (row,) = view.rows
    assert row["input_ids"] == [1, 2, 3, *out, 20, 30, 31]
    assert row["loss_mask"] == [0, 0, 0] + [1] * returned + [0, 1, 1]
