"""Shared fixtures for the simulator's tests: the app in-process and the task prompts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from collector.sim.app import create_app

ARITH = "What is 37 * 12 + 5? Use the calculator tool, then reply with the number only."
REFUND = "Order A-1001 for customer C-77 arrived damaged. Refund the full amount of 1000 dollars."
APPROVAL = ("Order A-2002 for customer C-78 needs a refund of 750 dollars; refunds over 500 need approval "
            "first.")
LOOKUP = "What is the status of order A-3003?"
TOOL_NAMES = ("calculator", "lookup_order", "refund", "close_tickets", "send_email", "request_approval")


def chat_tools() -> list[dict[str, Any]]:
    """Chat Completions tool specs for every built-in tool (schemas are not checked by the sim)."""
    return [{"type": "function", "function": {"name": n, "description": n,
                                              "parameters": {"type": "object", "properties": {}}}}
            for n in TOOL_NAMES]


def chat_body(model: str, content: str, cap: int, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "tools": chat_tools(),
            "max_completion_tokens": cap, **extra}


@pytest.fixture
def app() -> Starlette:
    return create_app(seed=7)


@pytest.fixture
async def client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as c:
        yield c
