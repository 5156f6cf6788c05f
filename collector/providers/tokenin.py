"""Token-in mode (`sampling.token_in`): every later turn's prompt sent as ids; the bridge.

On a multi-turn episode a chat endpoint re-renders the whole history from messages at every
turn, and the ids of turn k+1's prompt need not extend turn k's prompt + output (templates
re-serialize tool calls, strip reasoning, merge seams: docs/tokens.md, "Drift diagnostic").
Here the client sends the prompt as ids instead, built by extending what was already sent
and sampled, so each turn's prompt is by construction the previous prompt + output + the
new tokens: the episode is one training sequence.

The mode and its bridge are written once, here; each server is a small dialect
(`collector.providers.tokenin_dialect.TokenServer`: render, tokenize, generate), picked per
request by `SamplingParams.token_in` (`sampling.token_in_server`): llama.cpp
(`collector.providers.tokenin_llama`), vLLM (`tokenin_vllm`), SGLang (`tokenin_sglang`);
their module docstrings name the endpoints, fields and the source read.

Per turn:

1. render the whole history with the server's template: the server's own re-rendering, kept
   on the turn for the drift diagnostic (`Turn.rerendered_prompt_ids`; llama.cpp's text is
   tokenized with BOS added, as its chat endpoint does). On the first turn it is the prompt.
2. later turns, the bridge: ids = the previous prompt ids + its output ids + the closing +
   the suffix, where the suffix is what the template renders after the previous assistant
   turn (the tool results, notices, the next generation prompt). How the suffix is found:
   the history is rendered twice more with the previous assistant message replaced by a
   one-character text turn ("A", then "B"); the two renders differ only in that character,
   so their common tail is exactly what the template writes after an assistant turn's
   content: its end-of-turn + the later messages + the generation prompt. The bridge is
   safe when the real render ends with that tail (the template closes a call turn the way
   it closes a text turn) and, before it, with where the model stopped. Proven on the form
   the server renders in:

   - on text (llama.cpp): the tail is the common character tail; the closing is the stop
     string the ids lack (`TokenPrefix.stop_text`: llama.cpp's ids end before a matched
     stop string), which the real render must have right before the tail; closing + tail
     are tokenized by the server;
   - on ids (vLLM, SGLang: the render is ids): the probes must differ in exactly one id,
     the probe character's own id (`tokenize("A")`, `tokenize("B")`: one id each), so the
     common id tail starts on a token boundary right after the content; the real render's
     ids must end with that tail. Before it, the seam (`Seam`, kept per episode in
     `TurnRequest.wire_cache`): a matched stop string, which these servers keep in the ids,
     must end both the output ids and the render's head (its ids, tokenized alone); a stop
     token (EOS) must be the tail's first id (the template closes the turn with the token
     the model stopped on), counted once whether the ids hold it or not; a cut turn adds
     the tail to the ids as they are.

   `/apply-template` refuses a history that ends on an assistant turn (llama.cpp prefills
   it), which is why the probes keep the later messages instead of rendering "through the
   assistant turn".
3. otherwise the turn falls back to the server's own rendering (llama.cpp: the rendered
   text, as its chat endpoint would send it; vLLM and SGLang: the render's ids, which are
   what their chat endpoints would tokenize) and `Turn.token_in_fallback` says why:
   `no_previous_ids` (the previous turn returned none), `assistant_not_replayed` (the loop
   did not replay the previous turn: it showed nothing), `render_failed` (the server
   refused a probe render), `suffix_unproven` (no common tail, the real render does not end
   with it, or on ids: the probes differ in more than their character's id),
   `stop_text_unproven` (the render does not have the stop string or stop token where the
   model stopped, or on ids: the previous turn's seam is unknown).

Output: the servers return raw text, so tool calls are parsed from the template's
`<tool_call>` blocks in it (`collector.providers.textcalls.text_tool_calls`), the matched
stop string closing a block; the length checks and finish mapping are `finish_turn`'s.
Transport, retries and errors are `collector.providers.http`'s.

Tests: tests/providers/test_tokenin.py, tests/providers/test_tokenin_servers.py.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import httpx

from collector.errors import ConfigError, ProviderError
from collector.providers.base import Endpoint
from collector.providers.chat import chat_messages
from collector.providers.http import Http, Sleep
from collector.providers.textcalls import CALL_CLOSE, CALL_OPEN, text_tool_calls
from collector.providers.tokenin_dialect import Rendered, Seam, TokenServer
from collector.providers.tokenin_llama import LlamaServer
from collector.providers.tokenin_sglang import SglangServer
from collector.providers.tokenin_vllm import VllmServer
from collector.turn import JSONObject, TokenPrefix, Turn, TurnRequest

__all__ = [
    "CALL_CLOSE", "CALL_OPEN", "SERVERS", "TokenInProvider", "common_prefix_len", "common_suffix",
    "prove_on_ids", "text_tool_calls",
]

SERVERS: dict[str, type[LlamaServer | VllmServer | SglangServer]] = {
    "llama.cpp": LlamaServer,
    "vllm": VllmServer,
    "sglang": SglangServer,
}
"""`sampling.token_in_server` -> its dialect."""
_PROBES = ("A", "B")
_SEAM = "token_in_seam"
"""`TurnRequest.wire_cache` key: (length of the ids it belongs to, the previous turn's `Seam`)."""
_TOKENIZED_MAX = 256
"""Bound on the per-provider cache of tokenized probe characters and stop strings."""


def common_suffix(a: Sequence[object], b: Sequence[object]) -> int:
    """How many trailing items (characters, ids) `a` and `b` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[-1 - i] == b[-1 - i]:
        i += 1
    return i


def common_prefix_len(a: Sequence[object], b: Sequence[object]) -> int:
    """How many leading items `a` and `b` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prove_on_ids(ids: list[int], seam: Seam | None, rendered: list[int], probes: Sequence[list[int]],
                 probe_ids: Sequence[list[int]], stop_ids: list[int]) -> tuple[list[int] | None, str | None]:
    """The bridge proven on ids (see the module docstring): (the prompt ids, None) or (None, reason).

    `ids`: the previous prompt + output ids; `seam`: how they end (None: unknown);
    `rendered`: the real render's ids; `probes`: the "A" and "B" renders' ids; `probe_ids`:
    "A" and "B" tokenized alone; `stop_ids`: the seam's stop string tokenized alone."""
    a, b = probes
    tail = common_suffix(a, b)
    lead = common_prefix_len(a, b)
    one_id_apart = len(a) == len(b) == lead + 1 + tail
    if not one_id_apart or [a[lead]] != probe_ids[0] or [b[lead]] != probe_ids[1]:
        return None, "suffix_unproven"  # the probe character merged with the template's text
    if tail == 0 or common_suffix(rendered, a) < tail:
        return None, "suffix_unproven"
    closing = a[len(a) - tail:]
    head = rendered[: len(rendered) - tail]
    if seam is None:
        return None, "stop_text_unproven"
    if seam.stop:
        n = len(stop_ids)
        if not n or ids[len(ids) - n:] != stop_ids or head[len(head) - n:] != stop_ids:
            return None, "stop_text_unproven"
        return ids + closing, None
    if seam.token is not None:
        if closing[0] != seam.token:
            return None, "stop_text_unproven"
        held = ids[-1:] == [seam.token]
        return ids + (closing[1:] if held else closing), None
    return ids + closing, None


class TokenInProvider:
    """The token-in adapter: the bridge, over the server dialect each request names."""

    kind = "chat"

    def __init__(
        self,
        endpoint: Endpoint,
        client: httpx.AsyncClient,
        *,
        sleep: Sleep | None = None,
        rng: random.Random | None = None,
    ) -> None:
        headers = {"authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        self._http = Http(client, endpoint, "chat", headers, sleep, rng)
        root = endpoint.base_url.rstrip("/")
        self._root = root[: -len("/v1")] if root.endswith("/v1") else root
        self._servers: dict[str, TokenServer] = {}
        self._tokenized: dict[tuple[str, str], list[int]] = {}
        self._vocab: dict[tuple[str, str], int | None] = {}
        """Per (server, model): the vocabulary size it reports, asked once."""

    def _server(self, name: str | None) -> TokenServer:
        server = self._servers.get(name or "llama.cpp")
        if server is None:
            try:
                dialect = SERVERS[name or "llama.cpp"]
            except KeyError:
                raise ConfigError(
                    f"unknown token_in server {name!r}; expected one of {', '.join(SERVERS)}") from None
            server = self._servers[name or "llama.cpp"] = dialect(self._http, self._root)
        return server

    async def _tokenized_alone(self, server: TokenServer, model: str, text: str,
                               extra: dict[str, str]) -> list[int]:
        """`text` tokenized alone (no special tokens added), cached per (model, text): the
        probe characters and the stop strings are the same every turn."""
        key = (model, text)
        ids = self._tokenized.get(key)
        if ids is None:
            ids = await server.tokenize(model, text, False, extra)
            if len(self._tokenized) < _TOKENIZED_MAX:
                self._tokenized[key] = ids
        return ids

    async def _bridge(self, server: TokenServer, request: TurnRequest, prefix: TokenPrefix,
                      messages: list[JSONObject], tools: list[JSONObject] | None, rendered: Rendered,
                      extra: dict[str, str]) -> tuple[list[int] | None, str | None]:
        """(the prompt ids, None) when the bridge is proven safe, else (None, the reason)."""
        if prefix.ids is None:
            return None, "no_previous_ids"
        at = prefix.assistant_at
        if at >= len(messages) or messages[at].get("role") != "assistant":
            return None, "assistant_not_replayed"
        probes: list[Rendered] = []
        for char in _PROBES:
            probe = [*messages[:at], {"role": "assistant", "content": char}, *messages[at + 1:]]
            try:
                probes.append(await server.render(request.model, probe, tools, extra))
            except ProviderError:  # a template that refuses the probe: the bridge is unproven
                return None, "render_failed"
        if isinstance(rendered, str):
            texts = [p for p in probes if isinstance(p, str)]
            return await self._prove_on_text(server, request.model, prefix, rendered, texts, extra)
        id_probes = [p for p in probes if isinstance(p, list)]
        stored = request.wire_cache.get(_SEAM)
        seam = stored[1] if isinstance(stored, tuple) and stored[0] == len(prefix.ids) else None
        probe_ids = [await self._tokenized_alone(server, request.model, c, extra) for c in _PROBES]
        stop_ids = (await self._tokenized_alone(server, request.model, seam.stop, extra)
                    if seam is not None and seam.stop else [])
        return prove_on_ids(prefix.ids, seam, rendered, id_probes, probe_ids, stop_ids)

    async def _prove_on_text(self, server: TokenServer, model: str, prefix: TokenPrefix, rendered: str,
                             probes: list[str], extra: dict[str, str]) -> tuple[list[int] | None, str | None]:
        assert prefix.ids is not None
        if len(probes) != len(_PROBES):
            return None, "suffix_unproven"  # a server that rendered one probe in another form
        tail = common_suffix(*probes)
        if tail == 0 or common_suffix(rendered, probes[0]) < tail:
            return None, "suffix_unproven"
        head = rendered[: len(rendered) - tail]
        if not head.endswith(prefix.stop_text):
            return None, "stop_text_unproven"
        closing = prefix.stop_text + rendered[len(rendered) - tail:]
        return prefix.ids + await server.tokenize(model, closing, False, extra), None

    async def complete(self, request: TurnRequest) -> Turn:
        p = request.params
        server = self._server(p.token_in)
        extra = dict(p.extra_headers)
        messages = chat_messages(request.messages)
        tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                   "parameters": t.parameters}}
                 for t in request.tools] or None
        rendered = await server.render(request.model, messages, tools, extra)
        server_ids = (rendered if isinstance(rendered, list)
                      else await server.tokenize(request.model, rendered, True, extra))
        fallback: str | None = None
        sent: Rendered = server_ids
        if request.token_prefix is not None:
            bridged, fallback = await self._bridge(server, request, request.token_prefix, messages, tools,
                                                   rendered, extra)
            sent = bridged if bridged is not None else rendered
        turn, seam = await server.generate(request, sent, extra)
        vocab_key = (p.token_in or "llama.cpp", request.model)
        if vocab_key not in self._vocab and len(self._vocab) < _TOKENIZED_MAX:
            self._vocab[vocab_key] = await server.vocab_size(request.model, extra)
        turn.vocab_size = self._vocab.get(vocab_key)
        sent_ids = sent if isinstance(sent, list) else server_ids
        turn.prompt_token_ids = sent_ids
        turn.prompt_sent_as_ids = fallback is None
        turn.token_in_fallback = fallback
        turn.rerendered_prompt_ids = server_ids
        if turn.token_ids is not None:  # how these ids end, for the next turn's bridge on ids
            request.wire_cache[_SEAM] = (len(sent_ids) + len(turn.token_ids), seam)
        else:
            request.wire_cache.pop(_SEAM, None)
        return turn
