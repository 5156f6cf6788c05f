"""Fuzzing the provider adapters and the loop with arbitrary replies (hypothesis).

Each example serves a whole episode's replies through an `httpx.MockTransport` to a real
adapter (all four wire formats, streamed and not) driven by the real loop: recorded wire
examples with a value anywhere replaced by any JSON (wrong types, huge strings, unknown
finish reasons), arbitrary JSON bodies, broken SSE (cut, reordered, garbage lines), and
random statuses whose error body may echo the API key. Whatever arrives:

- `run_episode` returns (it never raises), and the episode ends with a typed `StopReason`;
- an `error` episode is not trainable, has reward 0 and names a `ProviderError` type (an
  adapter that raised anything else would break its contract and show up here);
- the key never appears in the stored record;
- and, once all examples ran, the episodes are committed to a run directory and
  `collector check` finds every invariant intact: nothing executed from a cut or malformed
  turn, every call id settled once, reward 0 for the stop_on reasons.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector import errors
from collector.config import LoopConfig, RunConfig, config_fingerprint, resolved_config
from collector.envs.arithmetic import ArithmeticEnv
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint, RetryPolicy
from collector.record.episode import Episode
from collector.record.shards import episodes_to_table
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from tests.checking import assert_run_checked

WIRE = Path(__file__).resolve().parents[1] / "providers" / "wire"
KEY = "sk-fuzz-PLANTED-7f3a9c0e51d24b68"
KINDS = ("chat", "responses", "anthropic", "gemini")
PROVIDER_ERRORS = {
    name for name, obj in vars(errors).items()
    if isinstance(obj, type) and issubclass(obj, errors.ProviderError)
}
FINISH_REASONS = [
    "stop", "length", "tool_calls", "function_call", "content_filter", "end_turn", "max_tokens",
    "tool_use", "pause_turn", "refusal", "model_context_window_exceeded", "STOP", "MAX_TOKENS",
    "MALFORMED_FUNCTION_CALL", "SAFETY", "OTHER", "", "unknown_reason", "LENGTH",
]


def _examples(kind: str) -> tuple[list[Any], list[str]]:
    """The recorded whole replies (decoded) and SSE streams (text) of one wire format."""
    prefixes = [kind] + (["vllm", "leak", "openrouter"] if kind == "chat" else [])
    bodies, streams = [], []
    for path in sorted(WIRE.iterdir()):
        if not any(path.name.startswith(p + "_") for p in prefixes) or "request" in path.name:
            continue
        if path.suffix == ".json" and "error" not in path.name:
            bodies.append(json.loads(path.read_text()))
        elif path.suffix == ".sse":
            streams.append(path.read_text())
    return bodies, streams


EXAMPLES = {kind: _examples(kind) for kind in KINDS}

huge = st.sampled_from(["x" * 100_000, "{" * 20_000, '{"a": "' + "9" * 50_000, "\u00e9\u4e2d" * 20_000])
scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40) | st.sampled_from(FINISH_REASONS) | huge
)
any_json = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out += _paths(value, (*prefix, index))
    return out


def _replace(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(node))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return copy


@st.composite
def mutated(draw: st.DrawFn, node: Any) -> Any:
    """`node` with one to three values (anywhere in the tree) replaced by arbitrary JSON."""
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(node)))
        node = _replace(node, path, draw(any_json))
    return node


@st.composite
def broken_sse(draw: st.DrawFn, stream: str) -> bytes:
    """A recorded stream, events mutated, dropped, duplicated or shuffled, maybe cut anywhere."""
    events = [e for e in stream.replace("\r\n", "\n").split("\n\n") if e.strip()]
    out = []
    for event in events:
        action = draw(st.sampled_from(["keep", "keep", "keep", "mutate", "drop", "twice", "garbage"]))
        if action == "drop":
            continue
        if action == "mutate":
            lines = event.split("\n")
            for i, line in enumerate(lines):
                if line.startswith("data:"):
                    try:
                        data = json.loads(line[5:])
                    except ValueError:
                        break
                    lines[i] = "data: " + json.dumps(draw(mutated(data)))
                    break
            event = "\n".join(lines)
        if action == "garbage":
            event = draw(st.sampled_from(["data: {", "data:", ": comment", "event: ping", "retry: x"])) + (
                "\n" + draw(st.text(max_size=30)).replace("\n\n", "\n")
            )
        out.append(event)
        if action == "twice":
            out.append(event)
    if draw(st.booleans()):
        out = draw(st.permutations(out))
    body = ("\n\n".join(out) + "\n\n").encode()
    if draw(st.integers(0, 3)) == 0:
        body = body[: draw(st.integers(0, len(body)))]
    return body


Reply = tuple[int, dict[str, str], bytes]
STATUSES = [400, 401, 402, 403, 404, 408, 409, 413, 429, 500, 502, 503, 529, 302, 204]
ODD_HEADERS: list[dict[str, str]] = [
    {}, {"retry-after": "0"}, {"retry-after": "soon"}, {"retry-after-ms": "-5"}, {"x-should-retry": "true"},
]


@st.composite
def reply(draw: st.DrawFn, kind: str, streaming: bool) -> Reply:
    """One HTTP reply of any shape, biased towards ones close to the wire format."""
    bodies, streams = EXAMPLES[kind]
    sse_headers = {"content-type": "text/event-stream"}
    json_headers = {"content-type": "application/json"}
    choice = draw(st.integers(0, 9))
    if choice <= 4 and streaming:
        return 200, sse_headers, draw(broken_sse(draw(st.sampled_from(streams))))
    if choice <= 4:
        return 200, json_headers, json.dumps(draw(mutated(draw(st.sampled_from(bodies))))).encode()
    if choice <= 6:
        return 200, json_headers, json.dumps(draw(any_json)).encode()
    if choice == 7:
        raw = draw(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
        return 200, draw(st.sampled_from([sse_headers, json_headers, {}])), raw
    status = draw(st.sampled_from(STATUSES))
    message = draw(st.sampled_from([f"Incorrect API key provided: {KEY}", "overloaded", "", "quota"]))
    body = draw(st.sampled_from([
        {"error": {"message": message, "type": draw(st.text(max_size=20)), "code": draw(any_json)}},
        {"type": "error", "error": {"type": "overloaded_error", "message": message}},
        [{"error": {"code": status, "message": message, "status": "UNAVAILABLE"}}],
        draw(any_json),
    ]))
    headers = {**json_headers, **draw(st.sampled_from(ODD_HEADERS))}
    return status, headers, json.dumps(body).encode()


LOOP = LoopConfig(max_steps=3, episode_timeout_s=10.0, tool_timeout_s=2.0)
TASK = ArithmeticEnv(num_tasks=1).tasks()[0]


async def run_one(kind: str, streaming: bool, replies: list[Reply], sample: int) -> Episode:
    queue = list(replies)

    def handler(request: httpx.Request) -> httpx.Response:
        status, headers, body = queue.pop(0) if queue else (500, {}, b"{}")
        return httpx.Response(status, headers=headers, content=body)

    async def no_wait(_: float) -> None:
        return None

    endpoint = Endpoint(
        base_url=base_url_for(kind, "http://fuzz.invalid"),
        api_key=KEY,
        streaming=streaming,
        request_timeout_s=5.0,
        retry=RetryPolicy(max_retries=1, initial_backoff_s=0.01, max_backoff_s=0.01),
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        provider = build_provider(kind, endpoint, client, sleep=no_wait)
        spec = EpisodeSpec(run_id="fuzz", model="fuzz-model", provider_kind=kind, budget=64, task=TASK,
                           sample=sample, env_name="arithmetic")
        return await run_episode(spec, provider, ArithmeticEnv(num_tasks=1), LOOP)


def assert_episode_invariants(episode: Episode) -> None:
    assert isinstance(episode.stop_reason, StopReason)
    if episode.stop_reason is StopReason.ERROR:
        assert episode.error is not None
        assert not episode.trainable
        assert episode.reward == 0.0
        assert episode.error.type in PROVIDER_ERRORS, (episode.error.type, episode.error.message)
    else:
        assert episode.error is None
        assert episode.trainable
    if episode.stop_reason in LOOP.stop_on:
        assert episode.reward == 0.0
    stored = episodes_to_table([episode]).to_pylist()[0]
    assert KEY not in json.dumps(stored, default=str)


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("kind", KINDS)
def test_arbitrary_replies_never_break_the_loop(kind: str, streaming: bool, tmp_path: Path) -> None:
    """Any sequence of replies ends the episode with a typed reason; invariants and `collector check` hold."""
    episodes: list[Episode] = []

    @settings(max_examples=60, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(replies=st.lists(reply(kind, streaming), min_size=1, max_size=4))
    def one(replies: list[Reply]) -> None:
        episode = asyncio.run(run_one(kind, streaming, replies, len(episodes)))
        assert_episode_invariants(episode)
        episodes.append(episode)

    one()
    cfg = RunConfig.model_validate(
        {"sweep": {"models": ["fuzz-model"], "budgets": [64]}, "loop": {"max_steps": 3}}
    )
    with LocalRunStore.open(tmp_path / "run", config_fingerprint(cfg), resolved_config(cfg)) as store:
        assert store.commit(episodes) == len(episodes)
    assert_run_checked(tmp_path / "run", allow_notes=False)
