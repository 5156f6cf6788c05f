"""A llama-server stand-in for the model check: it answers every model name with its own alias.

`/v1/models` lists only the alias (unless `list_models` is off, as on servers without the
endpoint); every chat request is answered by the simulator's `preset`, whatever model it
names, and the reply's `model` says `alias`, streamed or not.
"""

from __future__ import annotations

import json

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from collector.sim.app import create_app


def aliasing_app(alias: str, preset: str = "sim-perfect", list_models: bool = True) -> Starlette:
    sim = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(seed=0)), base_url="http://sim")

    async def models(request: Request) -> Response:
        if not list_models:
            return JSONResponse({"error": {"message": "not found"}}, status_code=404)
        listing = [{"id": alias, "object": "model", "owned_by": "llamacpp"}]
        return JSONResponse({"object": "list", "data": listing})

    async def chat(request: Request) -> Response:
        body = json.loads(await request.body())
        body["model"] = preset
        headers = {k: v for k, v in request.headers.items() if k.startswith("x-sim-")}
        reply = await sim.post("/v1/chat/completions", json=body, headers=headers)
        if reply.status_code != 200 or body.get("stream"):
            text = reply.text.replace('"model":' + json.dumps(preset), '"model":' + json.dumps(alias))
            return Response(text, status_code=reply.status_code, media_type=reply.headers["content-type"])
        payload = reply.json()
        payload["model"] = alias
        return JSONResponse(payload)

    return Starlette(routes=[Route("/v1/models", models, methods=["GET"]),
                             Route("/v1/chat/completions", chat, methods=["POST"])])
