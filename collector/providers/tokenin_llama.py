"""The llama.cpp `llama-server` token-in dialect (`sampling.token_in_server = "llama.cpp"`).

Read from llama.cpp's tools/server source and checked against a real one
(`scripts/real_llama/token_truth.py`):

- `POST /apply-template` (chat `messages` and `tools` -> `{"prompt": text}`, the generation
  prompt added): the render is text, so the bridge is proven on text. It refuses a history
  that ends on an assistant turn (it prefills it), which is why the probes keep the later
  messages;
- `POST /tokenize` (`content`, `add_special`, `parse_special` -> `{"tokens"}`); the first
  turn's ids are the render tokenized with BOS added, as the chat endpoint does (measured:
  the same count as its `prompt_tokens`);
- `POST /completion` (`prompt` as a token array or text, `n_predict`, `stop`,
  `return_tokens`, `n_probs`, `cache_prompt`; the reply's `content`, `tokens`,
  `completion_probabilities`, `stop_type` `eos`/`word`/`limit`, `stopping_word`,
  `tokens_predicted`, `tokens_evaluated`). A matched stop string is in neither `content` nor
  the probabilities; its ids are cut from `tokens` so ids and logprobs stay aligned, and it
  becomes `Turn.unreturned_stop`: the closing text the next bridge adds. The cut is checked:
  llama.cpp trims as many probabilities as the stop string has tokens on its own, which is
  not where it sat when it began or ended inside a sampled token; then the ids kept do not
  spell `content`, and the turn keeps no ids (the next one goes as text). The raw finish
  reason is `stop_type` verbatim (`limit` is the cap).

- `GET /v1/models` (`data[].meta.n_vocab`, with `vocab_type`, `n_ctx_train`, ...): the
  model's vocabulary size, which every returned id must be below (`vocab_size`; asked once
  per model, and a server that does not say leaves it unknown).

Tests: tests/providers/test_tokenin.py, tests/episode/test_token_range.py.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from collector.errors import ProviderError
from collector.providers.common import as_int, finish_turn, logprob_or_nan, merge_extra
from collector.providers.textcalls import text_tool_calls
from collector.providers.tokenin_dialect import (
    PARSE_ERRORS,
    Rendered,
    Seam,
    TokenServerBase,
    ints,
    sampling_fields,
)
from collector.turn import FinishClass, JSONObject, Turn, TurnRequest, Usage

__all__ = ["LlamaServer"]


class LlamaServer(TokenServerBase):
    """llama.cpp's token endpoints (see the module docstring)."""

    proves_on: ClassVar[Literal["text", "ids"]] = "text"

    async def render(self, model: str, messages: list[JSONObject], tools: list[JSONObject] | None,
                     extra: dict[str, str]) -> Rendered:
        """The server's template applied to `messages` (with the generation prompt)."""
        body: JSONObject = {"messages": messages}
        if tools:
            body["tools"] = tools
        payload, _ = await self.post("/apply-template", body, extra)
        prompt = payload.get("prompt") if isinstance(payload, dict) else None
        if not isinstance(prompt, str):
            raise self.http.protocol_error("apply-template reply has no prompt text")
        return prompt

    async def vocab_size(self, model: str, extra: dict[str, str]) -> int | None:
        """`n_vocab` from the model list's metadata (the one model a llama-server serves, or
        the entry named `model`), or None when it gives none."""
        try:
            payload = await self.http.get_json(self.root + "/v1/models", extra)
        except ProviderError:
            return None  # metadata the turn can do without: the ids are then bounded by 2**31
        entries = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(entries, list):
            return None
        named = [e for e in entries if isinstance(e, dict) and e.get("id") == model]
        for entry in named or entries[:1]:
            meta = entry.get("meta") if isinstance(entry, dict) else None
            size = meta.get("n_vocab") if isinstance(meta, dict) else None
            if isinstance(size, int) and not isinstance(size, bool) and size > 0:
                return size
        return None

    async def tokenize(self, model: str, text: str, add_special: bool, extra: dict[str, str]) -> list[int]:
        """The server's tokenizer on `text`, special tokens parsed (template markup is special)."""
        payload, _ = await self.post(
            "/tokenize", {"content": text, "add_special": add_special, "parse_special": True}, extra)
        try:
            return list(ints(payload["tokens"]))
        except PARSE_ERRORS:
            raise self.http.protocol_error("tokenize reply has no token ids") from None

    async def generate(self, request: TurnRequest, prompt: Rendered,
                       extra: dict[str, str]) -> tuple[Turn, Seam]:
        p = request.params
        body: JSONObject = {"prompt": prompt, "n_predict": request.max_output_tokens, "return_tokens": True,
                            "n_probs": max(1, p.top_logprobs or 0), "cache_prompt": True}
        sampling_fields(body, p)
        if p.extra_body:
            merge_extra(body, p.extra_body)
        payload, elapsed = await self.post("/completion", body, extra)
        try:
            turn = self._parse(payload, request, elapsed)
        except PARSE_ERRORS:
            raise self.http.protocol_error("reply is not a llama.cpp completion") from None
        # The bridge on text reads the closing from `unreturned_stop` (the tracker hands it on).
        return turn, Seam()

    def _parse(self, payload: Any, request: TurnRequest, elapsed: float) -> Turn:
        if payload.get("error"):
            raise self.http.stream_error(payload)
        content = payload["content"]
        if not isinstance(content, str):
            raise ValueError("content is not text")
        stop_type = payload.get("stop_type")
        stop_type = stop_type if isinstance(stop_type, str) else None
        word = payload.get("stopping_word")
        word = word if isinstance(word, str) and stop_type == "word" else ""
        tokens = ints(payload.get("tokens") or [])
        logprobs = [logprob_or_nan(entry.get("logprob") if isinstance(entry, dict) else None)
                    for entry in payload.get("completion_probabilities") or ()]
        # llama.cpp's `tokens` hold the stop string's ids, its probabilities do not (it trims
        # them by tokenizing `stopping_word`): the ids are cut to the ones with a logprob, so
        # ids and logprobs stay aligned and the stop string is the bridge's closing text.
        if word and len(logprobs) < len(tokens):
            tokens = tokens[: len(logprobs)]
            if _spelled(payload.get("completion_probabilities") or ()) != content:
                # The stop string began or ended inside a token: llama.cpp trimmed as many
                # probabilities as the stop string has tokens alone, which is not where it sat,
                # so the ids kept do not spell the text (a lost `}` before `</tool_call>`, say).
                # No ids at all beats ids that lie: the next turn goes as text
                # (`no_previous_ids`) and the trainer view leaves the episode out.
                tokens, logprobs = [], []
        text, calls = text_tool_calls(content, word, f"call_{len(request.messages)}")
        mapped = FinishClass.LENGTH if stop_type == "limit" else (
            FinishClass.TOOL_CALLS if calls else FinishClass.STOP)
        model = payload.get("model")
        turn = finish_turn(
            text=text,
            tool_calls=calls,
            raw_finish_reason=stop_type,
            mapped=mapped,
            says_length=stop_type == "limit",
            usage=Usage(as_int(payload.get("tokens_evaluated")), as_int(payload.get("tokens_predicted"))),
            max_output_tokens=request.max_output_tokens,
            latency_s=elapsed,
            token_ids=list(tokens) or None,
            logprobs=logprobs or None,
            response_model=model if isinstance(model, str) else None,
        )
        turn.unreturned_stop = word or None
        return turn


def _spelled(entries: Any) -> str | None:
    """The text the probability entries' tokens spell (their `bytes`, else `token`), or None
    when an entry carries neither."""
    out = bytearray()
    for entry in entries:
        raw = entry.get("bytes") if isinstance(entry, dict) else None
        if isinstance(raw, list) and all(isinstance(b, int) and 0 <= b < 256 for b in raw):
            out += bytes(raw)
        elif isinstance(entry, dict) and isinstance(entry.get("token"), str):
            out += entry["token"].encode()
        else:
            return None
    return out.decode("utf-8", "replace")
