"""The vLLM token-in dialect (`sampling.token_in_server = "vllm"`).

Read from vLLM's source (the stored index of vllm-project/vllm: vllm/entrypoints/serve/tokenize/
protocol.py at 343bacaf, vllm/entrypoints/openai/completion/protocol.py and
chat_completion/protocol.py at d5dba2d7, vllm/v1/engine/detokenizer.py; the repository was
too large to fetch whole):

- `POST /tokenize` with `messages` (a `TokenizeChatRequest`: `messages`, `tools`,
  `add_generation_prompt` true, `continue_final_message` false, `add_special_tokens` false,
  as its chat endpoint renders) -> `{"tokens", "count", "max_model_len", "token_strs"}`: the
  template rendered straight to ids, so the bridge is proven on ids. With `prompt` instead
  of `messages` (a `TokenizeCompletionRequest`) it tokenizes text: the closing pieces, the
  probe characters, a stop string. (`/detokenize`: `tokens` -> `{"prompt"}`; not needed.)
- `POST /v1/completions` with `prompt` as a list of ints, `max_tokens`, `stop`,
  `return_token_ids` true, `logprobs` (an int: alternatives per token) -> `choices[0]`:
  `text`, `finish_reason` (`stop`/`length`/`abort`...), `stop_reason` (the matched stop
  string, a stop token id, or null for EOS), `token_ids`, `prompt_token_ids`,
  `logprobs.token_logprobs`; `usage.prompt_tokens`/`completion_tokens`.
- A matched stop string: the detokenizer cuts it from the text only
  (`include_stop_str_in_output` false, the default), the output ids hold all of it (and the
  whole last token, should that token run past the string's end). So nothing goes on
  `Turn.unreturned_stop`; the `Seam` names the string, and the next bridge checks that the
  ids end with the string's ids and the template's render has them right before its
  closing. An EOS-ended turn holds the EOS id last (`stop_reason` null): the seam is that id.
- The chat endpoint: in this source `ChatCompletionRequest` has no prompt-ids field (neither
  a first-class one nor ids merged through `kv_transfer_params`, which only reaches the
  engine as sampling `extra_args`), so token-in goes to `/v1/completions`.

The text fallback sends the server's own rendering (`/tokenize` with messages: the ids its
chat endpoint would have tokenized) as the prompt.

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

__all__ = ["VllmServer"]


class VllmServer(TokenServerBase):
    """vLLM's token endpoints (see the module docstring)."""

    proves_on: ClassVar[Literal["text", "ids"]] = "ids"

    async def _tokens(self, body: JSONObject, extra: dict[str, str]) -> list[int]:
        payload, _ = await self.post("/tokenize", body, extra)
        try:
            return list(ints(payload["tokens"]))
        except PARSE_ERRORS:
            raise self.http.protocol_error("tokenize reply has no token ids") from None

    async def render(self, model: str, messages: list[JSONObject], tools: list[JSONObject] | None,
                     extra: dict[str, str]) -> Rendered:
        """The chat template on `messages`, as ids (what the chat endpoint would tokenize)."""
        body: JSONObject = {"model": model, "messages": messages, "add_generation_prompt": True,
                            "continue_final_message": False, "add_special_tokens": False}
        if tools:
            body["tools"] = tools
        return await self._tokens(body, extra)

    async def tokenize(self, model: str, text: str, add_special: bool, extra: dict[str, str]) -> list[int]:
        return await self._tokens({"model": model, "prompt": text, "add_special_tokens": add_special}, extra)

    async def generate(self, request: TurnRequest, prompt: Rendered,
                       extra: dict[str, str]) -> tuple[Turn, Seam]:
        p = request.params
        body: JSONObject = {"model": request.model, "prompt": prompt, "max_tokens": request.max_output_tokens,
                            "return_token_ids": True, "logprobs": max(1, p.top_logprobs or 0)}
        sampling_fields(body, p)
        if p.extra_body:
            merge_extra(body, p.extra_body)
        return await self.generate_parsed("/v1/completions", body, extra,
                                          lambda payload, elapsed: self._parse(payload, request, elapsed),
                                          "a vLLM completion")

    def _parse(self, payload: Any, request: TurnRequest, elapsed: float) -> tuple[Turn, Seam]:
        if payload.get("object") == "error":
            raise self.http.stream_error(payload)
        choice = payload["choices"][0]
        content = choice["text"]
        if not isinstance(content, str):
            raise ValueError("text is not text")
        finish = choice.get("finish_reason")
        finish = finish if isinstance(finish, str) else None
        reason = choice.get("stop_reason")
        tokens = ints(choice.get("token_ids") or [])
        logprobs = [logprob_or_nan(v) for v in ((choice.get("logprobs") or {}).get("token_logprobs") or ())]
        matched = reason if finish == "stop" and isinstance(reason, str) else ""
        text, calls = text_tool_calls(content, matched, f"call_{len(request.messages)}")
        usage = payload.get("usage") or {}
        model = payload.get("model")
        turn = finish_turn(
            text=text,
            tool_calls=calls,
            raw_finish_reason=finish,
            mapped=finish_class("chat", finish, bool(calls)),
            says_length=finish == "length",
            usage=Usage(as_int(usage.get("prompt_tokens")), as_int(usage.get("completion_tokens"))),
            max_output_tokens=request.max_output_tokens,
            latency_s=elapsed,
            token_ids=list(tokens) or None,
            logprobs=logprobs or None,
            response_model=model if isinstance(model, str) else None,
        )
        if finish != "stop":
            return turn, Seam()
        if matched:
            return turn, Seam(stop=matched)
        if isinstance(reason, int) and not isinstance(reason, bool):
            return turn, Seam(token=reason)  # a `stop_token_ids` entry
        return turn, Seam(token=tokens[-1] if tokens else None)  # EOS: the last id
