"""The simulator plays tools it has no template for: schema-valid calls, exact cut rates, then an answer."""

from __future__ import annotations

import json
import random
from functools import partial
from typing import Any

import httpx
import jsonschema
import pytest

from collector.config import LoopConfig
from collector.envs.base import Environment
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint
from collector.sim.app import create_app, simulate
from collector.sim.explore import NO_TOOLS_ANSWER, example_arguments
from collector.sim.generate import generate
from collector.sim.policy import Plan, decide
from collector.sim.presets import PRESETS
from collector.sim.truth import binomial_interval, plan_fixed_tokens, turn_cut_probability
from collector.stop import StopReason
from tests.docblocks import README, blocks
from tests.sim.curve import nearest_budget
from tests.untraced import untraced

PROMPT = "Ship 3 boxes of 'blue widgets' to zone eu by 2026-03-01, then confirm."

RICH = {
    "type": "object",
    "properties": {
        "count": {"type": "integer", "minimum": 1, "maximum": 10},
        "label": {"type": "string", "minLength": 2},
        "zone": {"enum": ["eu", "us", "apac"]},
        "express": {"type": "boolean"},
        "note": {"type": "string"},
        "address": {"$ref": "#/$defs/Address"},
        "items": {
            "type": "array",
            "minItems": 2,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "maxLength": 4},
                    "qty": {"type": "integer", "exclusiveMinimum": 0},
                },
                "required": ["sku", "qty"],
                "additionalProperties": False,
            },
        },
        "when": {"anyOf": [{"type": "null"}, {"type": "string", "format": "date"}]},
        "weight": {"type": ["number", "null"], "maximum": 0.5},
    },
    "required": ["count", "label", "zone", "express", "address", "items", "when", "weight"],
    "additionalProperties": False,
    "$defs": {
        "Address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "floor": {"type": "integer", "minimum": -2}},
            "required": ["city", "floor"],
            "additionalProperties": False,
        }
    },
}
GEMINI_STYLE = {
    "type": "OBJECT",
    "properties": {
        "name": {"type": "STRING"},
        "tags": {"type": "ARRAY", "items": {"type": "STRING", "enum": ["a", "b"]}},
    },
    "required": ["name", "tags"],
}


def _chat_tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": name, "parameters": parameters}}


def _chat(
    model: str, cap: int, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> dict[str, Any]:
    return {"model": model, "messages": messages, "tools": tools, "max_completion_tokens": cap}


def test_arguments_are_valid_for_their_schema() -> None:
    """Enums, required fields, nested objects through $ref, arrays with minItems, bounds, formats
    and nullable unions all get a value the schema accepts, numbers and quotes taken from the prompt."""
    args = dict(example_arguments(RICH, PROMPT))
    jsonschema.Draft202012Validator(RICH).validate(args)
    assert list(args) == RICH["required"]  # the schema's own order, required members only
    assert args["count"] == 3  # the prompt's first number that fits 1..10
    assert args["label"] == "blue widgets"  # the prompt's quoted text
    assert args["zone"] == "eu"
    assert len(args["items"]) == 2
    assert args["when"] == "2026-01-01"
    gemini = dict(example_arguments(GEMINI_STYLE, ""))
    jsonschema.Draft202012Validator(
        {
            **GEMINI_STYLE,
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
            },
        }
    ).validate(gemini)
    assert example_arguments({"type": "object"}, PROMPT) == ()


def test_arguments_depend_on_the_prompt_and_schema_only() -> None:
    """The same request plans the same arguments every time: a task's call turn has one fixed size."""
    history = [("user", PROMPT)]
    schemas = {"ship": RICH, "ping": {"type": "object", "properties": {}}}
    first = decide(history, frozenset(schemas), schemas)
    assert [c.name for c in first.calls] == ["ship", "ping"]
    assert decide(history, frozenset(schemas), schemas) == first


def test_no_tools_means_a_text_answer() -> None:
    """A request with no tools (a text-action task) gets a text turn and never a call."""
    gen = simulate(0, "chat", _chat("sim-terse", 512, [{"role": "user", "content": "Count the legs."}], []))
    assert gen.calls == []
    assert gen.text.endswith(NO_TOOLS_ANSWER)


async def test_each_wire_carries_schema_valid_calls_then_an_answer_with_the_results() -> None:
    """On all four wires an unknown prompt gets every offered tool called with valid arguments,
    then, after the results, an answer quoting them."""
    tools = {"ship": RICH, "tag": GEMINI_STYLE}
    validator = jsonschema.Draft202012Validator(RICH)
    bodies: dict[str, tuple[str, dict[str, Any]]] = {
        "chat": (
            "/v1/chat/completions",
            _chat(
                "sim-perfect",
                1024,
                [{"role": "user", "content": PROMPT}],
                [_chat_tool(n, p) for n, p in tools.items()],
            ),
        ),
        "responses": (
            "/v1/responses",
            {
                "model": "sim-perfect",
                "input": PROMPT,
                "max_output_tokens": 1024,
                "tools": [{"type": "function", "name": n, "parameters": p} for n, p in tools.items()],
            },
        ),
        "anthropic": (
            "/v1/messages",
            {
                "model": "sim-perfect",
                "max_tokens": 1024,
                "messages": [{"role": "user", "content": PROMPT}],
                "tools": [{"name": n, "input_schema": p} for n, p in tools.items()],
            },
        ),
        "gemini": (
            "/v1beta/models/sim-perfect:generateContent",
            {
                "contents": [{"role": "user", "parts": [{"text": PROMPT}]}],
                "generationConfig": {"maxOutputTokens": 1024},
                "tools": [
                    {
                        "functionDeclarations": [
                            {"name": n, "parametersJsonSchema": p} for n, p in tools.items()
                        ]
                    }
                ],
            },
        ),
    }
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(seed=3)), base_url="http://sim"
    ) as c:
        for kind, (path, body) in bodies.items():
            reply = (await c.post(path, json=body)).json()
            if kind == "chat":
                calls = [
                    (x["function"]["name"], json.loads(x["function"]["arguments"]))
                    for x in reply["choices"][0]["message"]["tool_calls"]
                ]
            elif kind == "responses":
                calls = [
                    (x["name"], json.loads(x["arguments"]))
                    for x in reply["output"]
                    if x["type"] == "function_call"
                ]
            elif kind == "anthropic":
                calls = [(x["name"], x["input"]) for x in reply["content"] if x["type"] == "tool_use"]
            else:
                calls = [
                    (p["functionCall"]["name"], p["functionCall"]["args"])
                    for p in reply["candidates"][0]["content"]["parts"]
                    if "functionCall" in p
                ]
            assert [n for n, _ in calls] == ["ship", "tag"], kind
            validator.validate(calls[0][1])
    # The answer turn quotes each result, in the order offered.
    ids = [f"call_{i}" for i in range(2)]
    messages = [
        {"role": "user", "content": PROMPT},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": i, "type": "function", "function": {"name": n, "arguments": "{}"}}
                for i, n in zip(ids, tools, strict=True)
            ],
        },
        {"role": "tool", "tool_call_id": ids[0], "content": "shipped: 7 parcels"},
        {"role": "tool", "tool_call_id": ids[1], "content": "tagged"},
    ]
    gen = simulate(
        3, "chat", _chat("sim-perfect", 1024, messages, [_chat_tool(n, p) for n, p in tools.items()])
    )
    assert gen.calls == []
    assert gen.text == "ship: shipped: 7 parcels; tag: tagged"


def test_a_tool_with_an_error_result_is_called_again_then_given_up() -> None:
    """An error result is retried (the model recovers from a wrong argument); after four tries the
    model answers with what did work."""
    schemas = {"ok": {"type": "object", "properties": {}}, "bad": {"type": "object", "properties": {}}}
    history: list[tuple[Any, ...]] = [("user", "go")]
    for i in range(4):
        plan = decide(history, frozenset(schemas), schemas)
        assert [c.name for c in plan.calls] == (["ok", "bad"] if i == 0 else ["bad"])
        for j, call in enumerate(plan.calls):
            history.append(("call", f"c{i}{j}", call.name, {}))
        for j, call in enumerate(plan.calls):
            text = "fine" if call.name == "ok" else "error: KeyError"
            history.append(("result", f"c{i}{j}", call.name, text, False))
    assert decide(history, frozenset(schemas), schemas) == Plan(answer="ok: fine", task="explore")


SCHEMAS = {"ship": RICH, "tag": GEMINI_STYLE}
N = 1500


@pytest.mark.parametrize("model", sorted(PRESETS))
def test_measured_cut_rate_of_explored_turns_matches_truth(model: str) -> None:
    """For every preset, over 1,500 generated turns, explored call turns (and the answer turn after
    them) are cut as often as the truth module says, within its 99% binomial band (exactly, for
    a preset whose lengths are fixed)."""
    history: list[tuple[Any, ...]] = [("user", PROMPT)]
    call_plan = decide(history, frozenset(SCHEMAS), SCHEMAS)
    answer_history = [
        *history,
        ("call", "a", "ship", {}),
        ("call", "b", "tag", {}),
        ("result", "a", "ship", "shipped", False),
        ("result", "b", "tag", "tagged", False),
    ]
    answer_plan = decide(answer_history, frozenset(SCHEMAS), SCHEMAS)
    assert call_plan.calls
    assert answer_plan.answer
    preset = PRESETS[model]
    for plan, step in ((call_plan, "call"), (answer_plan, "answer")):
        fixed = plan_fixed_tokens(model, plan)
        cut_probability = partial(turn_cut_probability, model, step=step, fixed_tokens=fixed)
        budget = nearest_budget(cut_probability, 0.5, 1, 2000)
        truth = cut_probability(budget)
        assert 0.2 < truth < 0.8 or truth in (0.0, 1.0)  # a step function has no middle
        with untraced():  # samples over lines the other tests cover (tests/untraced.py)
            cuts = sum(generate(plan, preset, budget, random.Random(budget * 31 + i)).cut for i in range(N))
        lo, hi = binomial_interval(truth, N)
        assert lo <= cuts <= hi, (model, step, budget, truth, cuts)


def test_http_explored_turns_cut_and_break_at_the_preset_rates() -> None:
    """Through the wire parser (chat), an explored call turn is cut at the truth's rate and its
    arguments are malformed at the preset's `malformed_prob`."""
    model = "sim-sloppy"
    call_plan = decide([("user", PROMPT)], frozenset(SCHEMAS), SCHEMAS)
    fixed = plan_fixed_tokens(model, call_plan)
    budget = next(b for b in range(1, 4000) if turn_cut_probability(model, b, "call", fixed) < 0.5)
    truth = turn_cut_probability(model, budget, "call", fixed)
    body = _chat(
        model, budget, [{"role": "user", "content": PROMPT}], [_chat_tool(n, p) for n, p in SCHEMAS.items()]
    )
    with untraced():  # samples over lines the other tests cover (tests/untraced.py)
        gens = [simulate(11, "chat", body, sim_seed=str(i)) for i in range(N)]
    lo, hi = binomial_interval(truth, N)
    assert lo <= sum(g.cut for g in gens) <= hi
    whole = [g for g in gens if g.calls and g.calls[-1].closed]
    lo, hi = binomial_interval(PRESETS[model].malformed_prob, len(whole))
    assert lo <= sum(g.calls[0].malformed for g in whole) <= hi


def _readme_env() -> Environment:
    """The environment class of README's "Your own environment" block, as a user would paste it."""
    code = next(b.code for b in blocks(README) if b.lang == "python" and "class MyEnv(Environment)" in b.code)
    namespace: dict[str, Any] = {"__name__": "readme_env"}
    exec(compile(code, "README.md", "exec"), namespace)  # the page's own code, nothing else
    env = namespace["MyEnv"](num_tasks=2)
    assert isinstance(env, Environment)
    return env


@pytest.mark.parametrize("kind", ["chat", "responses", "anthropic", "gemini"])
async def test_readme_example_environment_gets_tool_calls_and_rewards(kind: str) -> None:
    """The README's own example environment gets its tools called (add(40, 2) and quote) and
    reward 1 on every wire (sim-perfect), and mostly so on sim-terse, the demo's model."""
    env = _readme_env()
    terse = 0.0
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(seed=0))) as client:
        provider = build_provider(
            kind, Endpoint(base_url_for(kind, "http://sim.test"), api_key="sk-sim"), client
        )
        for sample in range(8):
            task = env.tasks()[0]
            spec = EpisodeSpec("readme", "sim-terse", kind, 512, task, sample=sample, env_name=env.name)
            episode = await run_episode(spec, provider, env, LoopConfig())
            assert episode.executed_tool_calls
            terse += episode.reward or 0.0
    assert terse >= 4
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(seed=0))) as client:
        endpoint = Endpoint(base_url_for(kind, "http://sim.test"), api_key="sk-sim")
        provider = build_provider(kind, endpoint, client)
        for task in env.tasks():
            spec = EpisodeSpec("readme", "sim-perfect", kind, 512, task, env_name=env.name)
            episode = await run_episode(spec, provider, env, LoopConfig())
            assert episode.stop_reason is StopReason.DONE, episode.error
            executed = {
                (c.name, json.dumps(json.loads(c.arguments_json), sort_keys=True))
                for c in episode.executed_tool_calls
            }
            assert executed == {("add", '{"a": 40, "b": 2}'), ("quote", '{"zone": "eu"}')}
            assert episode.reward == 1.0
