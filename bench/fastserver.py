"""A fast fake Chat Completions server: `python -m bench.fastserver --port N --latency-ms 50`.

Why not the simulator: uvicorn + starlette + the simulator's generator cost 0.7-0.9 ms of
CPU per turn, which caps one core at ~1,200 turns/s, under Little's bound for 256 in flight
at 50 ms (5,120 turns/s). This server is hand-written HTTP/1.1 on asyncio streams with
canned replies (~20-40 us per turn), so the *client* is what a run measures.

The episode is the same two-turn tool episode for every request stream: a request whose
last message is not a tool result gets a `calculator` call, one that ends with a tool
result gets the final answer. `GET .../models` lists the model (the collector's pre-run
model check). `GET /count` returns the number of completions served so far, which
`bench.e2e` polls to measure a steady window.
"""

from __future__ import annotations

import argparse
import asyncio
import json

MODEL = "fake"
_CALL = json.dumps({
    "id": "c1", "object": "chat.completion", "model": MODEL,
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "calculator", "arguments": "{\"expression\": \"2+3\"}"}}]}}],
    "usage": {"prompt_tokens": 60, "completion_tokens": 12, "total_tokens": 72},
}).encode()
_ANSWER = json.dumps({
    "id": "c2", "object": "chat.completion", "model": MODEL,
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "5"}}],
    "usage": {"prompt_tokens": 90, "completion_tokens": 1, "total_tokens": 91},
}).encode()
_MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
#: The tail of a body whose last message is a tool result (chat: `"role": "tool"` last).
_TOOL_TAIL = 400


def _reply(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


class Server:
    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.served = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, _, rest = head.partition(b"\r\n")
                length = 0
                for h in rest.split(b"\r\n"):
                    if h[:15].lower() == b"content-length:":
                        length = int(h[15:])
                body = await reader.readexactly(length) if length else b""
                path = line.split(b" ", 2)[1]
                if path == b"/count":
                    writer.write(_reply(str(self.served).encode()))
                    continue
                if path.endswith(b"/models"):
                    writer.write(_reply(_MODELS))
                    continue
                # The last message is a tool result when the last "role" in the body is "tool".
                tail = body[body.rfind(b'"role"'):][:_TOOL_TAIL]
                out = _reply(_ANSWER if b'"tool"' in tail[:16] else _CALL)
                self.served += 1
                if self.latency_s:
                    loop.call_later(self.latency_s, writer.write, out)
                else:
                    writer.write(out)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()


async def _main(port: int, latency_s: float) -> None:
    server = Server(latency_s)
    srv = await asyncio.start_server(server.handle, "127.0.0.1", port, backlog=4096)
    async with srv:
        await srv.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description="serve canned Chat Completions replies fast")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--latency-ms", type=float, default=50.0)
    args = p.parse_args()
    asyncio.run(_main(args.port, args.latency_ms / 1000.0))


if __name__ == "__main__":
    main()
