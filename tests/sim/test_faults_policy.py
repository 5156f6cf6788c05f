"""Transient faults, latency headers, the serving paths, and the policy working every task."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from collector.sim.policy import decide
from collector.sim.server import SimServer
from tests.sim.conftest import APPROVAL, ARITH, LOOKUP, REFUND, TOOL_NAMES, chat_body

TOOLS = frozenset(TOOL_NAMES)
EMAIL = 'Email ann@example.com with the subject "Your order" and this body: It ships, "soon", really.'
CLOSE = "Customer C-77 wants every ticket older than 30 days closed."


@pytest.mark.parametrize(
    ("prompt", "calls"),
    [
        (ARITH, [("calculator", {"expression": "37 * 12 + 5"})]),
        (REFUND, [("refund", {"order_id": "A-1001", "amount": 1000})]),
        (CLOSE, [("close_tickets", {"customer_id": "C-77", "older_than_days": 30})]),
        (
            EMAIL,
            [
                (
                    "send_email",
                    {"to": "ann@example.com", "subject": "Your order", "body": 'It ships, "soon", really.'},
                )
            ],
        ),
        (
            APPROVAL,
            [
                ("request_approval", {"action": "refund", "order_id": "A-2002", "reason": "refund over 500"}),
                ("refund", {"order_id": "A-2002", "amount": 750}),
            ],
        ),
        (LOOKUP, [("lookup_order", {"order_id": "A-3003"})]),
    ],
)
def test_policy_calls_the_right_tools_then_answers(
    prompt: str, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    """Each task template gets its exact calls in one turn, then an answer once the results are in."""
    plan = decide([("user", prompt)], TOOLS)
    assert [(c.name, dict(c.arguments)) for c in plan.calls] == calls
    history: list[tuple[Any, ...]] = [("user", prompt)]
    for i, (name, args) in enumerate(calls):
        history.append(("call", f"c{i}", name, args))
    for i, (name, _) in enumerate(calls):
        history.append(
            ("result", f"c{i}", name, '{"status": "shipped"}' if name == "lookup_order" else "449", False)
        )
    answer = decide(history, TOOLS)
    assert not answer.calls
    if prompt == ARITH:
        assert answer.answer == "449"
    if prompt == LOOKUP:
        assert "shipped" in answer.answer


@pytest.mark.parametrize(
    ("result", "answer"),
    [("  449\n", "449"), ("449 (rounded)", "449 (rounded)"), ('{"result": "449"}', "449"),
     ("[449]", "[449]")],
)
def test_the_arithmetic_answer_is_the_calculators_result_or_its_json_string(result: str, answer: str) -> None:
    """A harness's calculator may return plain text, a bare number or a JSON object: the answer
    is the text (stripped), or the object's status/output/result string."""
    history = [("user", ARITH), ("call", "c0", "calculator", None),
               ("result", "c0", "calculator", result, False)]
    assert decide(history, TOOLS).answer == answer


def test_policy_reissues_after_an_error_result_and_gives_up_eventually() -> None:
    """A "not executed" result makes the model call again; after four tries it answers instead."""
    history: list[tuple[Any, ...]] = [("user", REFUND)]
    for i in range(4):
        plan = decide(history, TOOLS)
        assert plan.calls[0].name == "refund"
        history += [
            ("call", f"c{i}", "refund", None),
            ("result", f"c{i}", "refund", "not executed: cut by the output-token limit", False),
        ]
    assert decide(history, TOOLS).calls == ()
    assert decide([("user", "tell me a joke")], frozenset()).answer


@pytest.mark.parametrize(
    ("path", "body", "overload"),
    [
        ("/v1/chat/completions", chat_body("sim-perfect", ARITH, 64), 503),
        ("/v1/responses", {"model": "sim-perfect", "input": ARITH}, 503),
        (
            "/v1/messages",
            {"model": "sim-perfect", "max_tokens": 64, "messages": [{"role": "user", "content": ARITH}]},
            529,
        ),
        (
            "/v1beta/models/sim-perfect:generateContent",
            {"contents": [{"role": "user", "parts": [{"text": ARITH}]}]},
            503,
        ),
    ],
)
async def test_forced_faults(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], overload: int
) -> None:
    """x-sim-fault gives 429 with retry-after, the dialect's overload status, a 500, and a dropped stream."""
    limited = await client.post(path, json=body, headers={"x-sim-fault": "rate_limit"})
    assert limited.status_code == 429
    assert limited.headers["retry-after"] == "0"
    assert (await client.post(path, json=body, headers={"x-sim-fault": "overload"})).status_code == overload
    assert (await client.post(path, json=body, headers={"x-sim-fault": "server_error"})).status_code == 500
    stream_path = path.replace(":generateContent", ":streamGenerateContent?alt=sse")
    whole = await client.post(stream_path, json={**body, "stream": True})
    dropped = await client.post(stream_path, json={**body, "stream": True}, headers={"x-sim-fault": "drop"})
    assert dropped.status_code == 200
    assert whole.text.startswith(dropped.text)
    assert len(dropped.text) < len(whole.text)


async def test_flaky_preset_faults_then_recovers(client: httpx.AsyncClient) -> None:
    """sim-flaky refuses some requests; retrying the same body succeeds with the fault-free reply."""
    statuses: list[int] = []
    for i in range(60):
        body = chat_body("sim-flaky", ARITH, 64)
        first = await client.post("/v1/chat/completions", json=body, headers={"x-sim-seed": str(i)})
        statuses.append(first.status_code)
        reply = first
        for _ in range(20):
            if reply.status_code == 200:
                break
            reply = await client.post("/v1/chat/completions", json=body, headers={"x-sim-seed": str(i)})
        assert reply.status_code == 200
        again = await client.post(
            "/v1/chat/completions", json=body, headers={"x-sim-seed": str(i), "x-sim-fault": "none"}
        )
        assert again.content == reply.content
    assert {429, 500, 503} & set(statuses)
    assert statuses.count(200) > 30


def test_sim_server_serves_on_loopback() -> None:
    """SimServer binds a free loopback port, serves requests, and stops."""
    with SimServer(seed=3) as server:
        assert server.base_url.startswith("http://127.0.0.1:")
        reply = httpx.post(
            server.base_url + "/v1/chat/completions",
            json=chat_body("sim-perfect", ARITH, 64),
            headers={"x-sim-latency-ms": "5"},
        )
        assert reply.status_code == 200
        assert json.loads(
            reply.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        ) == {"expression": "37 * 12 + 5"}
