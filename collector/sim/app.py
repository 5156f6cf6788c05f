"""The simulated provider as an ASGI app: five endpoints, four wire formats, one generator.

And llama-server's four token endpoints (token-in mode, `collector.sim.completion`), served
with the same presets, policy and generator.

Per request: parse the body strictly in the called dialect (errors come back in that
dialect's shape), pick the preset by model name (404 if unknown), derive the random stream
from (server seed, canonical body), maybe inject a transient fault, ask the policy for the
next move, generate and cut the turn, and render it in the dialect, streamed or not.

Determinism. The reply is a pure function of the server seed and the canonical request
body (keys sorted, `stream`/`stream_options` and the token-capture fields removed, so a
streamed and a non-streamed call of the same conversation yield the same turn, with or
without token ids), plus the optional `x-sim-seed` header.
Identical requests give byte-identical replies. Transient faults are the one exception by
design: a retry of the same body must be able to succeed, so the fault draw also uses how
many times this app has seen that body (`attempt`), kept in a bounded in-memory table, and
only for presets that inject faults.

Request headers the simulator honours (none is needed):
- `x-sim-latency-ms`: latency for this request, overriding the preset's;
- `x-sim-fault`: force `rate_limit`, `overload`, `server_error`, `drop` or `none`;
- `x-sim-seed`: mixed into the random stream (distinct samples of one identical prompt).

Weights (`collector.sim.weights`): `GET`/`POST /sim/weights`, `GET /model_info` and `/get_weight_version`
swap the version mid-run, aborting the Chat requests in flight (`finish_reason: "abort"`).

A preset with a `capacity` (`sim-hosted`, `sim-gpu`) is served through its server's load
model (`collector.sim.capacity`): the latency is waited for in a slot, and a request past the
queue or the token budget is refused (429 / 503) with the headers real servers send.

A body the parser cannot take (not JSON, not an object, nested past the interpreter's
recursion limit) is a 400 in the dialect's shape, like any other bad request.

Streams are rendered whole and sent as one `text/event-stream` body: the framing and event
order are the wire's, and the server does no per-event work (benchmarks need thousands of
requests a second). A dropped stream is the first part of the events, without the terminal.

Tests: tests/sim/test_validation.py, tests/sim/test_faults_policy.py,
tests/providers/test_sim.py, tests/sim/test_completion.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from collector.sim import anthropic as anthropic_wire
from collector.sim import chat as chat_wire
from collector.sim import completion as llama_wire
from collector.sim import gemini as gemini_wire
from collector.sim import responses as responses_wire
from collector.sim.capacity import CapacityModel, vllm_metrics
from collector.sim.errors import Dialect, SimError, context_overflow, error_payload, error_response
from collector.sim.generate import Generation, generate
from collector.sim.history import ParsedRequest
from collector.sim.policy import decide
from collector.sim.presets import PRESETS, ModelPreset
from collector.sim.weights import Weights

FAULTS = ("rate_limit", "overload", "server_error", "drop")
_MAX_TRACKED = 200_000
"""Bodies remembered for fault attempts; the table is cleared when it grows past this."""


_OUTPUT_ONLY = frozenset({"stream", "stream_options", "logprobs", "top_logprobs", "return_token_ids",
                          "return_prompt_token_ids"})
"""Request fields that change how a reply is rendered, never which turn is generated."""


def _canonical(body: dict[str, Any]) -> bytes:
    clean = {k: v for k, v in body.items() if k not in _OUTPUT_ONLY}
    return json.dumps(clean, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class _Simulator:
    """Holds the seed, the presets and the fault-attempt table; one instance per app."""

    def __init__(self, seed: int, presets: dict[str, ModelPreset], clock: Callable[[], float]) -> None:
        self.seed = seed
        self.presets = presets
        self.clock = clock
        """What the capacity presets' token buckets refill by (a test may stop it)."""
        self.attempts: dict[bytes, int] = {}
        self.weights = Weights()
        """The weight version, and the swaps that abort requests in flight (issue 27)."""
        self.capacities: dict[str, CapacityModel] = {}
        """Per preset with a `capacity`: its live load (`collector.sim.capacity`)."""

    def capacity_for(self, preset: ModelPreset) -> CapacityModel:
        assert preset.capacity is not None
        model = self.capacities.get(preset.name)
        if model is None:
            model = self.capacities[preset.name] = CapacityModel(preset.capacity, self.clock)
        return model

    def digest(self, dialect: str, model: str, canonical: bytes, extra: str) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{self.seed}\0{dialect}\0{model}\0{extra}\0".encode())
        h.update(canonical)
        return h.digest()

    def fault_for(self, preset: ModelPreset, digest: bytes, forced: str | None, stream: bool) -> str | None:
        if forced is not None:
            return None if forced == "none" else forced
        if preset.fault_prob <= 0.0:
            return None
        if len(self.attempts) > _MAX_TRACKED:
            self.attempts.clear()
        attempt = self.attempts.get(digest, 0)
        self.attempts[digest] = attempt + 1
        u = random.Random(int.from_bytes(digest, "big") ^ (attempt + 1) * 0x9E3779B97F4A7C15).random()
        for name, p in (("rate_limit", preset.rate_limit_prob), ("overload", preset.overload_prob),
                        ("server_error", preset.server_error_prob), ("drop", preset.stream_drop_prob)):
            if u < p:
                # A non-streaming reply cannot be dropped midway: it is served whole.
                return name if (name != "drop" or stream) else None
            u -= p
        return None


def _turn(req: ParsedRequest, preset: ModelPreset, digest: bytes) -> Generation:
    rng = random.Random(int.from_bytes(digest, "big"))
    return generate(decide(req.history, req.tools), preset, req.cap, rng, req.thinking_budget)


_PARSERS = {"chat": chat_wire.parse, "responses": responses_wire.parse, "anthropic": anthropic_wire.parse,
            "gemini": gemini_wire.parse}


def simulate(seed: int, dialect: Dialect, body: dict[str, Any], sim_seed: str = "") -> Generation:
    """The turn the app would generate for `body`, without HTTP (Gemini: `body["model"]` holds
    the model of the URL). For bulk checks of the ground truth; raises `SimError` on a bad body."""
    body = dict(body)
    model = body.get("model")
    if dialect == "gemini":
        body["stream"] = False
    req = _PARSERS[dialect](body)
    if dialect == "gemini":
        body.pop("model")
        body.pop("stream")
    canonical = _canonical(body)
    sim = _Simulator(seed, PRESETS, time.monotonic)  # no capacity state is consulted here
    return _turn(req, PRESETS[str(model)], sim.digest(dialect, req.model, canonical, sim_seed))


Parser = Callable[[dict[str, Any]], ParsedRequest]
Renderer = Callable[[ParsedRequest, Generation], dict[str, Any]]
StreamRenderer = Callable[[ParsedRequest, Generation], list[str]]


_TOO_DEEP = "The request body is nested too deeply."


async def _handle(sim: _Simulator, request: Request, dialect: Dialect, parse: Parser, render: Renderer,
                  render_stream: StreamRenderer, path_model: str | None = None,
                  path_stream: bool | None = None) -> Response:
    try:
        return await _reply(sim, request, dialect, parse, render, render_stream, path_model, path_stream)
    except RecursionError:
        # json.loads raises it for a body nested past the interpreter's recursion limit, and
        # json.dumps (the canonical body) for one nested just below it: either way the
        # client's input, a 400 in the dialect's shape, never a 500 text/plain from Starlette.
        return error_response(dialect, 400, _TOO_DEEP)


async def _reply(sim: _Simulator, request: Request, dialect: Dialect, parse: Parser, render: Renderer,
                 render_stream: StreamRenderer, path_model: str | None, path_stream: bool | None) -> Response:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError:
        return error_response(dialect, 400, "The request body is not valid JSON.")
    if not isinstance(body, dict):
        return error_response(dialect, 400, "The request body must be a JSON object.")
    if path_model is not None:
        body = {**body, "model": path_model, "stream": path_stream}
    model = body.get("model")
    if isinstance(model, str) and model not in sim.presets:
        return error_response(
            dialect, 404, f"The model `{model}` does not exist or you do not have access to it.",
            param="model")
    try:
        req = parse(body)
    except SimError as exc:
        return error_response(dialect, exc.status, exc.message, param=exc.param)
    preset = sim.presets[req.model]
    req.preset = preset
    refused = chat_wire.refusal(req) if dialect == "chat" else None
    if refused is not None:
        return error_response(dialect, refused.status, refused.message)
    if preset.responses_server == "llamacpp" and req.short_assistant is not None:
        return error_response(dialect, 400, req.short_assistant)
    if preset.thinking is not None and req.unreasoned is not None:
        return error_response(dialect, 400, req.unreasoned)
    headers = request.headers
    if path_model is not None:
        body.pop("model")
        body.pop("stream")
    canonical = _canonical(body)
    req.prompt_tokens = max(1, len(canonical) // 4)
    if preset.context_window is not None and req.prompt_tokens > preset.context_window:
        return context_overflow(dialect, req.prompt_tokens, preset.context_window)
    digest = sim.digest(dialect, req.model, canonical, headers.get("x-sim-seed", ""))
    fault = sim.fault_for(preset, digest, headers.get("x-sim-fault"), req.stream)
    if fault is not None and fault not in FAULTS:
        return error_response(dialect, 400, f"Unknown x-sim-fault {fault!r}.")
    gen = _turn(req, preset, digest)
    latency = gen.latency_s
    if "x-sim-latency-ms" in headers:
        try:
            latency = max(0.0, float(headers["x-sim-latency-ms"]) / 1000.0)
        except ValueError:
            return error_response(dialect, 400, "x-sim-latency-ms must be a number.")
    rate_headers: dict[str, str] = {}
    version = sim.weights.version
    if preset.capacity is not None:
        # The server's load decides: a refusal, or a wait for a slot and the service time.
        served = await sim.capacity_for(preset).serve(latency, req.prompt_tokens, req.cap, gen.output_tokens)
        if not isinstance(served, dict):
            # Anthropic says 529 where the others say 503 (provider-protocols.md).
            status = 529 if dialect == "anthropic" and served.status == 503 else served.status
            reply = error_response(dialect, status, served.message)
            reply.headers.update(served.headers)
            return reply
        rate_headers = served
    elif dialect == "chat":  # vLLM / SGLang: a weight swap aborts the requests in flight
        version, aborted = await sim.weights.generate(latency)
        if aborted:
            if req.stream:
                events = chat_wire.render_abort_stream(req, gen)
                return Response("".join(events), media_type="text/event-stream")
            return Response(json.dumps(chat_wire.render_abort(req, gen, version)),
                            media_type="application/json")
    elif latency > 0:
        await asyncio.sleep(latency)
    if fault == "rate_limit":
        return error_response(dialect, 429, "Rate limit reached for the simulated model. Please try again.",
                              retry_after_s=preset.retry_after_s)
    if fault == "overload":
        if dialect == "anthropic":
            return error_response(dialect, 529, "Overloaded")
        return error_response(dialect, 503, "The model is overloaded. Please try again later.")
    if fault == "server_error":
        return error_response(dialect, 500, "The server had an error while processing your request.")
    if not req.stream:
        body = render(req, gen)
        if dialect == "chat" and chat_wire.reports_version(req):
            chat_wire.with_weight_version(body, version)
        return Response(json.dumps(body), media_type="application/json", headers=rate_headers)
    events = render_stream(req, gen)
    if fault == "drop":
        events = events[: max(1, len(events) // 2)]
    return Response("".join(events), media_type="text/event-stream", headers=rate_headers)


_LLAMA_ENDPOINTS = ("apply-template", "tokenize", "detokenize", "completion")


def _llama_reply(error: SimError, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(llama_wire.error_payload(error)), status_code=error.status, headers=headers,
                    media_type="application/json")


async def _llama(sim: _Simulator, request: Request, endpoint: str, path_model: str | None) -> Response:
    """One of llama-server's token endpoints (`collector.sim.completion`)."""
    try:
        body = json.loads(await request.body())
    except (ValueError, RecursionError):
        return _llama_reply(llama_wire.LlamaError(400, "the request body is not valid JSON"))
    if not isinstance(body, dict):
        return _llama_reply(llama_wire.LlamaError(400, "the request body must be a JSON object"))
    model = path_model if path_model is not None else body.get("model")
    if not isinstance(model, str):
        return _llama_reply(llama_wire.LlamaError(
            400, "\"model\" is required: the simulator serves many models; name one in the body or "
                 "call /llamacpp/{model}/" + endpoint))
    preset = sim.presets.get(model)
    if preset is None:
        return _llama_reply(llama_wire.LlamaError(404, f"model '{model}' not found"))
    try:
        if endpoint == "apply-template":
            return JSONResponse(llama_wire.apply_template(preset, body))
        if endpoint == "tokenize":
            return JSONResponse(llama_wire.tokenize_body(body))
        if endpoint == "detokenize":
            return JSONResponse(llama_wire.detokenize_body(body))
        return await _llama_completion(sim, request, preset, body)
    except RecursionError:
        return _llama_reply(llama_wire.LlamaError(400, _TOO_DEEP))
    except llama_wire.LlamaError as exc:
        return _llama_reply(exc)


async def _llama_completion(sim: _Simulator, request: Request, preset: ModelPreset,
                            body: dict[str, Any]) -> Response:
    prompt = llama_wire.prompt_of(body)
    if preset.context_window is not None and len(prompt) > preset.context_window:
        return Response(json.dumps(llama_wire.context_overflow(len(prompt), preset.context_window)),
                        status_code=400, media_type="application/json")
    canonical = json.dumps({k: v for k, v in body.items() if k not in llama_wire.OUTPUT_ONLY},
                           sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    headers = request.headers
    digest = sim.digest("completion", preset.name, canonical, headers.get("x-sim-seed", ""))
    fault = sim.fault_for(preset, digest, headers.get("x-sim-fault"), False)
    if fault is not None and fault not in FAULTS:
        raise llama_wire.LlamaError(400, f"Unknown x-sim-fault {fault!r}.")
    reply, gen = llama_wire.complete(preset, prompt, body, random.Random(int.from_bytes(digest, "big")))
    latency = gen.latency_s
    if "x-sim-latency-ms" in headers:
        try:
            latency = max(0.0, float(headers["x-sim-latency-ms"]) / 1000.0)
        except ValueError:
            raise llama_wire.LlamaError(400, "x-sim-latency-ms must be a number.") from None
    if preset.capacity is not None:
        served = await sim.capacity_for(preset).serve(latency, len(prompt), gen.cap, gen.output_tokens)
        if not isinstance(served, dict):
            return _llama_reply(llama_wire.LlamaError(served.status, served.message), served.headers)
    elif latency > 0:
        await asyncio.sleep(latency)
    if fault == "rate_limit":
        return _llama_reply(llama_wire.LlamaError(429, "Rate limit reached for the simulated model."),
                            {"retry-after": str(preset.retry_after_s)})
    if fault == "overload":
        return _llama_reply(llama_wire.LlamaError(503, "Loading model"))
    if fault == "server_error":
        return _llama_reply(llama_wire.LlamaError(500, "The server had an error processing your request."))
    return Response(json.dumps(reply), media_type="application/json")


def create_app(
    seed: int = 0, presets: dict[str, ModelPreset] | None = None, clock: Callable[[], float] = time.monotonic
) -> Starlette:
    """The simulated provider: `/v1/chat/completions`, `/v1/responses`, `/v1/messages`,
    `/v1beta/models/{model}:generateContent` and `:streamGenerateContent` (`?alt=sse`), and
    llama-server's `/apply-template`, `/tokenize`, `/detokenize`, `/completion` (also under
    `/llamacpp/{model}/`), and `GET /metrics` (each capacity preset's load in vLLM's names).

    `presets` defaults to `collector.sim.presets.PRESETS`; a test may pass its own table, and a
    `clock` that the capacity presets' token buckets refill by (one that stands still makes a
    budget test independent of the machine's speed).
    """
    sim = _Simulator(seed, dict(PRESETS if presets is None else presets), clock)

    async def chat(request: Request) -> Response:
        return await _handle(sim, request, "chat", chat_wire.parse, chat_wire.render, chat_wire.render_stream)

    async def responses(request: Request) -> Response:
        return await _handle(sim, request, "responses", responses_wire.parse, responses_wire.render,
                             responses_wire.render_stream)

    async def messages(request: Request) -> Response:
        return await _handle(sim, request, "anthropic", anthropic_wire.parse, anthropic_wire.render,
                             anthropic_wire.render_stream)

    async def gemini(request: Request) -> Response:
        target = request.path_params["target"]
        model, _, method = target.rpartition(":")
        if method not in ("generateContent", "streamGenerateContent") or not model:
            return error_response("gemini", 404, f"Method {target!r} is not found.")
        return await _handle(sim, request, "gemini", gemini_wire.parse, gemini_wire.render,
                             gemini_wire.render_stream, path_model=model,
                             path_stream=method == "streamGenerateContent")

    async def weights(request: Request) -> Response:
        if request.method == "GET":
            return JSONResponse(sim.weights.state())
        try:
            return JSONResponse(sim.weights.control(json.loads(await request.body() or b"{}")))
        except ValueError as exc:
            return JSONResponse({"error": {"message": f"/sim/weights: {exc}"}}, status_code=400)

    async def metrics(request: Request) -> Response:
        return Response(vllm_metrics(sim.capacities), media_type="text/plain; version=0.0.4")

    async def weight_version(request: Request) -> Response:
        return JSONResponse({"weight_version": sim.weights.version})  # SGLang's shape

    def llama(endpoint: str) -> Route:
        async def root(request: Request) -> Response:
            return await _llama(sim, request, endpoint, None)
        return Route("/" + endpoint, root, methods=["POST"])

    def llama_of_model(endpoint: str) -> Route:
        async def prefixed(request: Request) -> Response:
            return await _llama(sim, request, endpoint, request.path_params["model"])
        return Route("/llamacpp/{model}/" + endpoint, prefixed, methods=["POST"])

    return Starlette(routes=[
        Route("/sim/weights", weights, methods=["GET", "POST"]),
        Route("/metrics", metrics, methods=["GET"]),  # vLLM's Prometheus text of each capacity
        Route("/model_info", weight_version, methods=["GET"]),  # SGLang's current endpoint
        Route("/get_weight_version", weight_version, methods=["GET"]),  # and its former one
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1beta/models/{target:path}", gemini, methods=["POST"]),
        # google-genai says `v1` instead of `v1beta` when handed a custom base_url.
        Route("/v1/models/{target:path}", gemini, methods=["POST"]),
        # llama-server's token endpoints (token-in mode): the model in the body, or in the path.
        *(llama(e) for e in _LLAMA_ENDPOINTS),
        *(llama_of_model(e) for e in _LLAMA_ENDPOINTS),
    ])


__all__ = ["FAULTS", "create_app", "error_payload", "simulate"]
