"""The adapters against the simulator (in-process, `httpx.ASGITransport`), all four transports in
both modes: whole episodes replay cleanly, the measured cut rate matches the simulator's ground
truth, hidden cuts and leaks are caught, transient faults are retried away."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from starlette.applications import Starlette

from collector.errors import RequestRejected
from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint, Provider, RetryPolicy
from collector.sim.app import create_app
from collector.sim.truth import binomial_interval, turn_cut_probability
from collector.turn import (
    ArgStatus,
    AssistantMessage,
    FinishClass,
    LengthSignal,
    Message,
    SystemMessage,
    ToolResultMessage,
    ToolSpec,
    Turn,
    TurnRequest,
    UserMessage,
)
from tests.providers.wirefab import KINDS, MODES
from tests.untraced import untraced

ARITH = "What is 37 * 12 + 5? Use the calculator tool, then reply with the number only."
CALC = ToolSpec(
    "calculator",
    "Evaluate an arithmetic expression.",
    {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
)
EXPECTED_ARGS = {"expression": "37 * 12 + 5"}
PATHS = list(itertools.product(KINDS, MODES))


def path_id(p: tuple[str, bool]) -> str:
    return f"{p[0]}-{'sse' if p[1] else 'json'}"


@pytest.fixture(scope="module")
def app() -> Starlette:
    return create_app(seed=11)


async def _no_wait(_: float) -> None:
    return None


SENT: list[httpx.Request] = []


async def _count(request: httpx.Request) -> None:
    SENT.append(request)


@pytest.fixture
async def connect(app: Starlette) -> AsyncIterator[Callable[[str, bool, int], Provider]]:
    """Adapters over the in-process simulator; `sample` goes in `x-sim-seed` for distinct draws."""
    clients: list[httpx.AsyncClient] = []
    SENT.clear()

    def factory(kind: str, stream: bool, sample: int = 0) -> Provider:
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            headers={"x-sim-seed": str(sample)},
            event_hooks={"request": [_count]},
        )
        clients.append(client)
        endpoint = Endpoint(
            base_url_for(kind, "http://sim"),
            api_key="sim-key",
            streaming=stream,
            retry=RetryPolicy(max_retries=8),
        )
        return build_provider(kind, endpoint, client, sleep=_no_wait, rng=random.Random(sample))

    yield factory
    for client in clients:
        await client.aclose()


def _request(model: str, history: list[Message], cap: int) -> TurnRequest:
    return TurnRequest(model=model, messages=history, tools=[CALC], max_output_tokens=cap)


@pytest.mark.parametrize("path", PATHS, ids=path_id)
async def test_episode_replays_cleanly(
    connect: Callable[[str, bool, int], Provider], path: tuple[str, bool]
) -> None:
    """A call, its result and the final answer round-trip through the simulator's strict history checks."""
    kind, stream = path
    provider = connect(kind, stream, 0)
    history: list[Message] = [SystemMessage("You are careful."), UserMessage(ARITH)]
    first = await provider.complete(_request("sim-perfect", history, 512))
    assert first.finish_class is FinishClass.TOOL_CALLS
    (call,) = first.tool_calls
    assert (call.name, call.status, call.arguments) == ("calculator", ArgStatus.OK, EXPECTED_ARGS)
    history += [AssistantMessage(first.text, first.tool_calls), ToolResultMessage(call.id, call.name, "449")]
    second = await provider.complete(_request("sim-perfect", history, 512))
    assert second.finish_class is FinishClass.STOP
    assert "449" in second.text
    assert second.tool_calls == []


MALFORMED_CASES = [
    # sim-sloppy writes whole calls whose arguments are not JSON; only the string-argument
    # transports carry them (Anthropic's server returns objects, Gemini withholds the call).
    *((kind, stream, "sim-sloppy", 512) for kind in ("chat", "responses") for stream in MODES),
    # A call cut at cap 3 is a MALFORMED fragment wherever the raw fragment reaches the adapter:
    # the string transports in both modes, and Anthropic's stream (`input_json_delta` pieces).
    *((kind, stream, "sim-perfect", 3) for kind in ("chat", "responses") for stream in MODES),
    ("anthropic", True, "sim-perfect", 3),
]


def _case_id(case: tuple[str, bool, str, int]) -> str:
    return f"{path_id((case[0], case[1]))}-{case[2]}-{case[3]}"


def _replayed_arguments(kind: str, body: bytes) -> list[object]:
    """The arguments of every call a request body replays, as they are on the wire."""
    data = json.loads(body)
    if kind == "chat":
        return [c["function"]["arguments"] for m in data["messages"] for c in m.get("tool_calls") or ()]
    if kind == "responses":
        return [item["arguments"] for item in data["input"] if item.get("type") == "function_call"]
    if kind == "anthropic":
        return [
            b["input"]
            for m in data["messages"]
            if isinstance(m["content"], list)
            for b in m["content"]
            if b.get("type") == "tool_use"
        ]
    return [
        p["functionCall"].get("args") for c in data["contents"] for p in c["parts"] if "functionCall" in p
    ]


@pytest.mark.parametrize("case", MALFORMED_CASES, ids=_case_id)
async def test_malformed_call_replays_as_empty_object(
    connect: Callable[[str, bool, int], Provider], case: tuple[str, bool, str, int]
) -> None:
    """A malformed call (broken JSON or a cut fragment) answered with an error result replays as `{}`,
    the strict simulator accepts that history, and the model issues the call again, whole."""
    kind, stream, model, cap = case
    for sample in range(40):
        provider = connect(kind, stream, sample)
        first = await provider.complete(_request(model, [UserMessage(ARITH)], cap))
        if any(c.status is ArgStatus.MALFORMED for c in first.tool_calls):
            break
    else:
        pytest.fail(f"no malformed call from {model} at cap {cap} in 40 samples")
    (call,) = first.tool_calls
    assert (call.name, call.status, call.arguments) == ("calculator", ArgStatus.MALFORMED, None)
    assert first.is_length is (cap == 3)  # sloppy calls are whole, just not JSON; cap 3 cuts
    history: list[Message] = [
        UserMessage(ARITH),
        AssistantMessage(first.text, first.tool_calls),
        ToolResultMessage(
            call.id, call.name, "not executed: the arguments were not a valid JSON object", True
        ),
    ]
    again = await provider.complete(_request("sim-perfect", history, 512))
    # The last request sent is the replay: its one call carries `{}`, never the broken fragment.
    assert _replayed_arguments(kind, SENT[-1].content) == [{} if kind == "anthropic" else "{}"]
    assert again.finish_class is FinishClass.TOOL_CALLS
    assert [(c.name, c.status, c.arguments) for c in again.tool_calls] == [
        ("calculator", ArgStatus.OK, EXPECTED_ARGS)
    ]


@pytest.mark.parametrize("stream", MODES)
async def test_anthropic_whole_replies_never_carry_a_malformed_call(
    connect: Callable[[str, bool, int], Provider], stream: bool
) -> None:
    """Anthropic: sim-sloppy's calls arrive as objects (never MALFORMED); a call cut at cap 3 is an
    OK `{}` in a whole reply (only the stop reason tells) and a MALFORMED fragment in a stream."""
    for sample in range(40):
        turn = await connect("anthropic", stream, sample).complete(
            _request("sim-sloppy", [UserMessage(ARITH)], 512)
        )
        assert all(c.status is ArgStatus.OK for c in turn.tool_calls)
    cut = await connect("anthropic", stream, 0).complete(_request("sim-perfect", [UserMessage(ARITH)], 3))
    assert cut.raw_finish_reason == "max_tokens"
    assert LengthSignal.FINISH_REASON in cut.length_signals
    (call,) = cut.tool_calls
    if stream:
        assert (call.status, call.arguments, call.raw_arguments) == (ArgStatus.MALFORMED, None, '{"ex')
    else:
        assert (call.status, call.arguments) == (ArgStatus.OK, {})


@pytest.mark.parametrize("stream", MODES)
async def test_gemini_withholds_malformed_and_cut_calls(
    connect: Callable[[str, bool, int], Provider], stream: bool
) -> None:
    """Gemini never hands over a malformed or cut call: MALFORMED_FUNCTION_CALL and MAX_TOKENS turns
    have no call, so nothing is replayed; replaying such a turn as an empty model content is a 400."""
    for sample in range(40):
        sloppy = await connect("gemini", stream, sample).complete(
            _request("sim-sloppy", [UserMessage(ARITH)], 512)
        )
        if sloppy.raw_finish_reason == "MALFORMED_FUNCTION_CALL":
            break
    else:
        pytest.fail("no MALFORMED_FUNCTION_CALL from sim-sloppy in 40 samples")
    assert sloppy.tool_calls == []
    assert not sloppy.is_length
    if not stream:
        assert sloppy.text == ""  # the whole reply has no parts; a stream may have sent text first
    cut = await connect("gemini", stream, 0).complete(_request("sim-perfect", [UserMessage(ARITH)], 3))
    assert (cut.raw_finish_reason, cut.text, cut.tool_calls) == ("MAX_TOKENS", "", [])
    assert cut.is_length
    history: list[Message] = [UserMessage(ARITH), AssistantMessage("", []), UserMessage("Go on.")]
    with pytest.raises(RequestRejected) as refused:
        await connect("gemini", stream, 0).complete(_request("sim-perfect", history, 512))
    assert refused.value.status == 400


BUDGET = {"sim-terse": 24, "sim-hidden-cut": 40}
N = 120


@pytest.mark.parametrize("path", PATHS, ids=path_id)
@pytest.mark.parametrize("model", sorted(BUDGET))
async def test_cut_rate_matches_ground_truth(
    connect: Callable[[str, bool, int], Provider], path: tuple[str, bool], model: str
) -> None:
    """Over many call turns the length-turn rate lies in the 99% interval of the simulator's truth."""
    kind, stream = path
    budget = BUDGET[model]
    truth = turn_cut_probability(model, budget, "call")
    assert 0.1 < truth < 0.9
    lo, hi = binomial_interval(truth, N)
    cuts = 0
    with untraced():  # samples over lines the other tests cover (tests/untraced.py)
        for sample in range(N):
            provider = connect(kind, stream, sample)
            turn = await provider.complete(_request(model, [UserMessage(ARITH)], budget))
            if turn.is_length:
                cuts += 1
            else:
                # Not cut: the call is whole and parses (terse has wrong-value errors, never broken JSON).
                assert all(c.status is ArgStatus.OK for c in turn.tool_calls)
    assert lo <= cuts <= hi, (cuts, lo, hi, truth)


@pytest.mark.parametrize("stream", MODES)
async def test_hidden_cut_is_caught_by_cap(
    connect: Callable[[str, bool, int], Provider], stream: bool
) -> None:
    """Chat calls cut at the cap but reported `tool_calls` are length turns via CAP_REACHED."""
    hidden = 0
    for sample in range(60):
        turn = await connect("chat", stream, sample).complete(
            _request("sim-hidden-cut", [UserMessage(ARITH)], 40)
        )
        if turn.raw_finish_reason == "tool_calls" and turn.usage.output_tokens >= 40:
            hidden += 1
            assert turn.is_length
            assert LengthSignal.CAP_REACHED in turn.length_signals
    assert hidden > 0


@pytest.mark.parametrize(
    "path", [("chat", False), ("chat", True), ("responses", False), ("responses", True)], ids=path_id
)
async def test_leaky_gateway_repairs_are_exact(
    connect: Callable[[str, bool, int], Provider], path: tuple[str, bool]
) -> None:
    """Leaked delimiters are repaired to exactly the intended arguments, or left malformed; never altered."""
    kind, stream = path
    statuses: set[ArgStatus] = set()
    for sample in range(80):
        turn = await connect(kind, stream, sample).complete(_request("sim-leaky", [UserMessage(ARITH)], 512))
        for call in turn.tool_calls:
            statuses.add(call.status)
            if call.status is not ArgStatus.MALFORMED:
                assert call.arguments == EXPECTED_ARGS
    assert ArgStatus.REPAIRED in statuses


@pytest.mark.parametrize("path", PATHS, ids=path_id)
async def test_flaky_provider_retried_to_success(
    connect: Callable[[str, bool, int], Provider], path: tuple[str, bool]
) -> None:
    """429s, overloads, 500s and dropped streams are retried until a turn comes back."""
    kind, stream = path
    for sample in range(40):
        turn = await connect(kind, stream, sample).complete(_request("sim-flaky", [UserMessage(ARITH)], 512))
        assert isinstance(turn, Turn)
    assert len(SENT) > 40  # some requests failed and were retried
