"""The weather sweep on every wire against real servers nobody here wrote (issue 31). Not run in CI.

Runs the few-shot weather episodes (`weather_env`) through the collector's own episode loop and
adapters, over loopback, against llama-server's own Chat, Responses and Anthropic routes and
LiteLLM's Responses, Anthropic and Gemini routes (../shared/tools/real-llama,
../shared/tools/real-gateway), each streamed and not, at a sweep of per-turn caps. Prints, per
wire and mode:

- `cut`: turns whose generation reached the cap, as the *engine* says (see below), and
  `classified`: how many of those the collector recorded as `length`;
- `ran-from-cut`: tool calls executed from those turns (must be 0);
- `complete`: call turns the engine finished under the cap, and `ran-once`: how many had every
  call executed exactly once (must be all; a call split in two, or a complete call recorded as
  cut, shows here); `called-length`: complete turns recorded as `length` anyway;
- `gens/turn`: engine generations per turn (1.0 unless a reply was retried) and the stop reasons.

The engine's truth. Every request reaches llama-server through a recording proxy on loopback
(LiteLLM's `LLAMA_API_BASE` points at it, and so do the llama-server wires), which reads each
reply of the engine in its own dialect: a generation reached the cap when its finish says so
(Chat `length`, Anthropic `max_tokens`) or its output tokens reached the request's cap (this
llama-server's Responses route never says `incomplete`). Episodes run one at a time, so the
engine's requests line up with the record's turns (a turn used 1 + its retries).

    bash scripts/real_wires_sweep            # starts both servers, runs this, stops them
    python scripts/real_llama/wires.py --llama http://127.0.0.1:18082 \\
        --gateway http://127.0.0.1:18090 --proxy-port 18091   # servers already up

The gateway's key comes from `GW_KEY` (never printed). No network beyond loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))

from weather_env import environment

from collector.config import LoopConfig
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint, RetryPolicy
from collector.turn import SamplingParams

MODEL = "gemma3-270m"
CAPS = (8, 14, 20, 29, 32, 36, 40, 64)
# (label, adapter kind, which server): every route the two READMEs list.
WIRES = (
    ("llama/chat", "chat", "llama"),
    ("llama/responses", "responses", "llama"),
    ("llama/anthropic", "anthropic", "llama"),
    ("litellm/responses", "responses", "gateway"),
    ("litellm/anthropic", "anthropic", "gateway"),
    ("litellm/gemini", "gemini", "gateway"),
)


# --- the engine's truth -------------------------------------------------------------------------


@dataclass
class Generation:
    """One reply of the engine, as the proxy read it."""

    path: str
    cap: int | None
    reached: bool | None
    """The generation reached the cap (None: the reply could not be read)."""


def _sse_data(body: bytes) -> list[Any]:
    out = []
    for line in body.decode("utf-8", "replace").splitlines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            try:
                out.append(json.loads(line[5:]))
            except ValueError:
                continue
    return out


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_generation(path: str, request: dict[str, Any], status: int, body: bytes) -> Generation:
    """Whether the engine's reply reached the request's cap, read in the route's own dialect."""
    cap = _int(
        request.get("max_tokens") or request.get("max_completion_tokens") or request.get("max_output_tokens")
    )
    if status != 200 or cap is None:
        return Generation(path, cap, None)
    events = _sse_data(body) if request.get("stream") else [json.loads(body)]
    said_cut = False
    tokens: int | None = None
    for event in (e for e in events if isinstance(e, dict)):
        if path.endswith("/chat/completions"):
            said_cut |= any(c.get("finish_reason") == "length" for c in event.get("choices") or ())
            tokens = _int((event.get("usage") or {}).get("completion_tokens")) or tokens
        elif path.endswith("/responses"):
            inner = event.get("response")
            response: dict[str, Any] = inner if isinstance(inner, dict) else event
            said_cut |= response.get("status") == "incomplete"
            tokens = _int((response.get("usage") or {}).get("output_tokens")) or tokens
        elif path.endswith("/messages"):
            stop = event.get("stop_reason") or (event.get("delta") or {}).get("stop_reason")
            said_cut |= stop == "max_tokens"
            tokens = _int((event.get("usage") or {}).get("output_tokens")) or tokens
    if not said_cut and tokens is None:
        return Generation(path, cap, None)
    return Generation(path, cap, said_cut or (tokens is not None and tokens >= cap))


class TruthProxy(ThreadingHTTPServer):
    """Forwards every request to llama-server and records how each generation ended."""

    def __init__(self, port: int, upstream: str) -> None:
        super().__init__(("127.0.0.1", port), _Forward)
        self.upstream = upstream.rstrip("/")
        self.client = httpx.Client(timeout=600.0)
        self.log: list[Generation] = []
        self.lock = threading.Lock()


class _Forward(BaseHTTPRequestHandler):
    server: TruthProxy

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: request lines would interleave with the table

    def _relay(self, method: str) -> None:
        length = int(self.headers.get("content-length") or 0)
        content = self.rfile.read(length) if length else b""
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")}
        upstream = self.server.client.request(
            method, self.server.upstream + self.path, content=content, headers=headers
        )
        if method == "POST":
            try:
                request = json.loads(content)
                generation = read_generation(self.path, request, upstream.status_code, upstream.content)
            except ValueError:
                generation = Generation(self.path, None, None)
            with self.server.lock:
                self.server.log.append(generation)
        self.send_response(upstream.status_code)
        self.send_header("content-type", upstream.headers.get("content-type", "application/json"))
        self.send_header("content-length", str(len(upstream.content)))
        self.end_headers()
        self.wfile.write(upstream.content)

    def do_POST(self) -> None:
        self._relay("POST")

    def do_GET(self) -> None:
        self._relay("GET")


# --- the sweep ----------------------------------------------------------------------------------


@dataclass
class Tally:
    episodes: int = 0
    turns: int = 0
    generations: int = 0
    unknown_truth: int = 0
    cut: int = 0
    classified: int = 0
    ran_from_cut: int = 0
    complete: int = 0
    ran_once: int = 0
    called_length: int = 0
    stops: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)


async def sweep_one(
    model: str,
    label: str,
    kind: str,
    root: str,
    key: str | None,
    stream: bool,
    caps: tuple[int, ...],
    tasks: int,
    proxy: TruthProxy,
) -> Tally:
    tally = Tally()
    settings = LoopConfig(max_steps=4)
    endpoint = Endpoint(
        base_url_for(kind, root),
        api_key=key,
        streaming=stream,
        request_timeout_s=300.0,
        retry=RetryPolicy(max_retries=4),
    )
    async with httpx.AsyncClient() as client:
        provider = build_provider(kind, endpoint, client)
        for cap in caps:
            for task in environment.tasks()[:tasks]:
                spec = EpisodeSpec(
                    run_id="real-wires",
                    model=model,
                    provider_kind=kind,
                    budget=cap,
                    task=task,
                    sampling=SamplingParams(temperature=0.0, stop=["</tool_call>"]),
                    credentials=(key,) if key else (),
                )
                mark = len(proxy.log)
                episode = await run_episode(spec, provider, environment, settings)
                with proxy.lock:
                    generations = proxy.log[mark:]
                tally.episodes += 1
                tally.stops[str(episode.stop_reason)] += 1
                if episode.error is not None:
                    tally.errors[f"{episode.error.type}: {episode.error.message[:120]}"] += 1
                tally.generations += len(generations)
                executed = Counter(c.turn_index for c in episode.executed_tool_calls)
                at = 0
                for turn in episode.turns:
                    used = 1 + len(turn.retries or ())
                    truth = generations[at + used - 1].reached if at + used <= len(generations) else None
                    at += used
                    tally.turns += 1
                    if truth is None:
                        tally.unknown_truth += 1
                    elif truth:
                        tally.cut += 1
                        tally.classified += turn.finish_class == "length"
                        tally.ran_from_cut += executed[turn.index]
                    elif turn.num_tool_calls:
                        tally.complete += 1
                        ids = [c.call_id for c in episode.executed_tool_calls if c.turn_index == turn.index]
                        tally.ran_once += len(ids) == turn.num_tool_calls == len(set(ids))
                        tally.called_length += turn.finish_class == "length"
    print(f"  done {label} {'sse' if stream else 'json'}", file=sys.stderr, flush=True)
    return tally


def _row(label: str, mode: str, t: Tally) -> str:
    stops = ", ".join(f"{k} {v}" for k, v in sorted(t.stops.items()))
    gens = t.generations / t.turns if t.turns else 0.0
    return (
        f"{label:<18} {mode:<4} {t.episodes:>4} {t.turns:>5} {t.cut:>4} {t.classified:>10} "
        f"{t.ran_from_cut:>12} {t.complete:>8} {t.ran_once:>8} {t.called_length:>13} {gens:>9.2f} "
        f"{t.unknown_truth:>7}  {stops}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--llama", default="http://127.0.0.1:18082", help="llama-server root")
    parser.add_argument("--gateway", default="http://127.0.0.1:18090", help="LiteLLM proxy root ('' to skip)")
    parser.add_argument(
        "--proxy-port",
        type=int,
        default=18091,
        help="the recording proxy's port (LiteLLM's LLAMA_API_BASE must be http://127.0.0.1:PORT/v1)",
    )
    parser.add_argument("--caps", default=",".join(map(str, CAPS)))
    parser.add_argument("--tasks", type=int, default=1, help="weather tasks per cap")
    parser.add_argument("--wires", default="", help="comma-separated labels (default: all)")
    parser.add_argument(
        "--model", default=MODEL, help="the served model name (a simulator preset to try the plumbing)"
    )
    args = parser.parse_args()
    caps = tuple(int(c) for c in args.caps.split(","))
    proxy = TruthProxy(args.proxy_port, args.llama)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    key = os.environ.get("GW_KEY")
    chosen = [w for w in WIRES if not args.wires or w[0] in args.wires.split(",")]
    rows: list[str] = []
    errors: list[str] = []
    try:
        for label, kind, server in chosen:
            if server == "gateway" and not args.gateway:
                continue
            root = f"http://127.0.0.1:{args.proxy_port}" if server == "llama" else args.gateway
            for stream in (False, True):
                tally = await sweep_one(
                    args.model,
                    label,
                    kind,
                    root,
                    key if server == "gateway" else None,
                    stream,
                    caps,
                    args.tasks,
                    proxy,
                )
                rows.append(_row(label, "sse" if stream else "json", tally))
                errors.extend(
                    f"  {label} {'sse' if stream else 'json'}: {n} x {e}" for e, n in tally.errors.items()
                )
    finally:
        proxy.shutdown()
    print(f"weather sweep, caps {','.join(map(str, caps))}, {args.tasks} task(s) per cap, temperature 0")
    print(
        f"{'wire':<18} {'mode':<4} {'eps':>4} {'turns':>5} {'cut':>4} {'classified':>10} "
        f"{'ran-from-cut':>12} {'complete':>8} {'ran-once':>8} {'called-length':>13} {'gens/turn':>9} "
        f"{'unknown':>7}  stop reasons"
    )
    for row in rows:
        print(row)
    if errors:
        print("error episodes (type: message, as recorded):")
        print("\n".join(errors))


if __name__ == "__main__":
    asyncio.run(main())
