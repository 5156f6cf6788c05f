"""The SGLang token-in dialect (`sampling.token_in_server = "sglang"`).

Read from SGLang's source (the stored index of sgl-project/sglang:
python/sglang/srt/entrypoints/http_server.py, entrypoints/openai/serving_tokenize.py at
0351c1fa, managers/detokenizer_manager.py `trim_matched_stop`, sampling_params; the
repository was too large to fetch whole):

- rendering a chat: SGLang has no template endpoint, and its `/v1/tokenize` (also
  `/tokenize`) takes only text (`prompt`, `add_special_tokens` -> `{"tokens", "count",
  "max_model_len"}`). So the history is rendered by its chat endpoint:
  `POST /v1/chat/completions` with `messages`, `tools`, `max_tokens` 1 and
  `return_prompt_token_ids` true; `choices[0].prompt_token_ids` is the template's render as
  ids, exactly what a chat request would have been given. It costs one generated token per
  render (the prompt mostly a prefix-cache hit); the bridge is proven on ids.
- `POST /generate` with `input_ids`, `sampling_params` (`max_new_tokens`, `stop`,
  `temperature`, `top_p`, `sampling_seed`), `return_logprob` true and `top_logprobs_num` ->
  `text`, `output_ids`, `meta_info`: `finish_reason` `{"type": "stop"|"length"|"abort",
  "matched": str | int}`, `prompt_tokens`, `completion_tokens`, `output_token_logprobs`
  (`[logprob, token_id, text]` per output token), `weight_version` (the policy version).
- A matched stop string is cut from the text only (`no_stop_trim` false): the ids hold it,
  the `Seam` names it, nothing goes on `Turn.unreturned_stop`. A matched stop token (EOS is
  one) is `matched` as an int; the detokenizer trims it from what it decodes, so the ids may
  or may not end with it: the bridge accepts both.

The text fallback sends the server's own rendering (the chat endpoint's prompt ids) as
`input_ids`. `sampling.extra_body` is merged into the `/generate` body as is, so SGLang's
own sampling fields go there nested, as `{"sampling_params": {...}}`.

Tests: tests/providers/test_tokenin_servers.py.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from collector.providers.common import as_int, finish_turn, logprob_or_nan, merge_extra
from collector.providers.finish import finish_class
from collector.providers.textcalls import text_tool_calls
from collector.providers.tokenin_dialect import (
    PARSE_ERRORS,
    Rendered,
    Seam,
    TokenServerBase,
    ints,
    sampling_fields,
)
from collector.turn import JSONObject, Turn, TurnRequest, Usage

__all__ = ["SglangServer"]


class SglangServer(TokenServerBase):
    """SGLang's token endpoints (see the module docstring)."""

    proves_on: ClassVar[Literal["text", "ids"]] = "ids"

    async def render(self, model: str, messages: list[JSONObject], tools: list[JSONObject] | None,
                     extra: dict[str, str]) -> Rendered:
        """The chat template on `messages`, as the chat endpoint's prompt ids."""
        body: JSONObject = {"model": model, "messages": messages, "max_tokens": 1, "temperature": 0,
                            "return_prompt_token_ids": True}
        if tools:
            body["tools"] = tools
        payload, _ = await self.post("/v1/chat/completions", body, extra)
        try:
            return list(ints(payload["choices"][0]["prompt_token_ids"]))
        except PARSE_ERRORS:
            raise self.http.protocol_error("chat reply has no prompt token ids") from None

    async def tokenize(self, model: str, text: str, add_special: bool, extra: dict[str, str]) -> list[int]:
        payload, _ = await self.post(
            "/v1/tokenize", {"model": model, "prompt": text, "add_special_tokens": add_special}, extra)
        try:
            return list(ints(payload["tokens"]))
        except PARSE_ERRORS:
            raise self.http.protocol_error("tokenize reply has no token ids") from None

    async def generate(self, request: TurnRequest, prompt: Rendered,
                       extra: dict[str, str]) -> tuple[Turn, Seam]:
        p = request.params
        sampling: JSONObject = {"max_new_tokens": request.max_output_tokens}
        sampling_fields(sampling, p, seed_field="sampling_seed")
        body: JSONObject = {"input_ids": prompt, "sampling_params": sampling, "return_logprob": True,
                            "top_logprobs_num": max(1, p.top_logprobs or 0), "stream": False}
        if p.extra_body:
            merge_extra(body, p.extra_body)
        return await self.generate_parsed("/generate", body, extra,
                                          lambda payload, elapsed: self._parse(payload, request, elapsed),
                                          "an SGLang generation")

    def _parse(self, payload: Any, request: TurnRequest, elapsed: float) -> tuple[Turn, Seam]:
        if payload.get("object") == "error":
            raise self.http.stream_error(payload)
        content = payload["text"]
        if not isinstance(content, str):
            raise ValueError("text is not text")
        meta = payload["meta_info"]
        reason = meta.get("finish_reason") or {}
        finish = reason.get("type")
        finish = finish if isinstance(finish, str) else None
        matched = reason.get("matched")
        tokens = ints(payload.get("output_ids") or [])
        # Each entry is [logprob, token id, token text].
        logprobs = [logprob_or_nan(e[0] if isinstance(e, list) and e else None)
                    for e in meta.get("output_token_logprobs") or ()]
        stop = matched if finish == "stop" and isinstance(matched, str) else ""
        text, calls = text_tool_calls(content, stop, f"call_{len(request.messages)}")
        turn = finish_turn(
            text=text,
            tool_calls=calls,
            raw_finish_reason=finish,
            mapped=finish_class("chat", finish, bool(calls)),
            says_length=finish == "length",
            usage=Usage(as_int(meta.get("prompt_tokens")), as_int(meta.get("completion_tokens"))),
            max_output_tokens=request.max_output_tokens,
            latency_s=elapsed,
            token_ids=list(tokens) or None,
            logprobs=logprobs or None,
        )
        version = meta.get("weight_version")
        if isinstance(version, int) and not isinstance(version, bool):
            version = str(version)
        if isinstance(version, str) and version:
            turn.policy_version, turn.policy_version_source = version, "server"
        if finish != "stop":
            return turn, Seam()
        if stop:
            return turn, Seam(stop=stop)
        if isinstance(matched, int) and not isinstance(matched, bool):
            return turn, Seam(token=matched)
        return turn, Seam()
