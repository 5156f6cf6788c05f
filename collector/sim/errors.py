"""Error replies in each provider's own shape (the wire examples in provider-protocols.md).

Clients classify errors by status and by the fields of these bodies (`code`, `type`,
`status`), so the simulator must get the shapes right, not just the status codes. A request
the simulator rejects raises `SimError` anywhere in parsing; the app turns it into the reply
of the dialect that was called.

Tests: tests/sim/test_validation.py.
"""

from __future__ import annotations

import json
from typing import Literal

from starlette.responses import Response

Dialect = Literal["chat", "responses", "anthropic", "gemini"]


class SimError(Exception):
    """A request the simulated server refuses, with the HTTP status to refuse it with."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


_OPENAI_TYPE = {400: "invalid_request_error", 404: "invalid_request_error", 429: "tokens",
                500: "server_error", 503: "server_error"}
_OPENAI_CODE = {404: "model_not_found", 429: "rate_limit_exceeded"}
_ANTHROPIC_TYPE = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error",
                   500: "api_error", 529: "overloaded_error"}
_GEMINI_STATUS = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
                  503: "UNAVAILABLE"}


def error_payload(dialect: Dialect, status: int, message: str, *, param: str | None = None,
                  request_id: str = "req_sim", retry_after_s: int = 0,
                  code: str | None = None) -> dict[str, object]:
    """The JSON body of an error reply (also used for in-stream error events)."""
    if dialect == "anthropic":
        kind = _ANTHROPIC_TYPE.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}
    if dialect == "gemini":
        err: dict[str, object] = {"code": status, "message": message,
                                  "status": _GEMINI_STATUS.get(status, "INTERNAL")}
        if status == 429:
            err["details"] = [{"@type": "type.googleapis.com/google.rpc.RetryInfo",
                               "retryDelay": f"{retry_after_s}s"}]
        return {"error": err}
    return {"error": {"message": message, "type": _OPENAI_TYPE.get(status, "server_error"), "param": param,
                      "code": code or _OPENAI_CODE.get(status)}}


def error_response(dialect: Dialect, status: int, message: str, *, param: str | None = None,
                   request_id: str = "req_sim", retry_after_s: int | None = None,
                   code: str | None = None) -> Response:
    """An HTTP error reply; 429s carry `retry-after`, Anthropic replies `request-id`."""
    headers: dict[str, str] = {}
    if retry_after_s is not None:
        headers["retry-after"] = str(retry_after_s)
    if dialect == "anthropic":
        headers["request-id"] = request_id
        if status >= 500 or status == 429:
            headers["x-should-retry"] = "true"
    body = error_payload(dialect, status, message, param=param, request_id=request_id,
                         retry_after_s=retry_after_s or 0, code=code)
    return Response(json.dumps(body), status_code=status, headers=headers, media_type="application/json")


def context_overflow(dialect: Dialect, tokens: int, window: int) -> Response:
    """The dialect's own context-length error, worded as the wire examples word it (the
    clients classify it by `code` or by these words)."""
    if dialect == "chat":
        message = (f"This model's maximum context length is {window} tokens. However, your messages "
                   f"resulted in {tokens} tokens. Please reduce the length of the messages.")
        return error_response(dialect, 400, message, param="messages", code="context_length_exceeded")
    if dialect == "responses":
        message = ("Your input exceeds the context window of this model. "
                   "Please adjust your input and try again.")
        return error_response(dialect, 400, message, param="input", code="context_length_exceeded")
    if dialect == "anthropic":
        return error_response(dialect, 400, f"prompt is too long: {tokens} tokens > {window} maximum")
    message = f"The input token count ({tokens}) exceeds the maximum number of tokens allowed ({window})."
    return error_response(dialect, 400, message)
