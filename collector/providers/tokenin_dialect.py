"""What a token-in server dialect is: the three things the bridge asks of a server.

Token-in mode (`collector.providers.tokenin`) is written once; each server it speaks to is a
small dialect (`collector.providers.tokenin_llama`, `tokenin_vllm`, `tokenin_sglang`) that
answers three questions:

- `render`: the server's chat template applied to the history (with the generation prompt),
  in the form the server gives it: text (llama.cpp `/apply-template`; the bridge is then
  proven on text, `proves_on = "text"`) or ids (vLLM's `/tokenize` with messages, SGLang's
  chat endpoint's prompt ids: the bridge is proven on ids, `proves_on = "ids"`);
- `tokenize`: the server's tokenizer on a piece of text (special tokens parsed, none added
  unless asked: the closing, a probe character, a stop string);
- `generate`: one completion from a prompt given as ids (or, llama.cpp's text fallback, as
  text), parsed into a `Turn`, with the `Seam`: how the output ids end, which the next
  turn's bridge needs (a matched stop string held in the ids, the stop token, or nothing).

And one it may answer: `vocab_size`, the model's vocabulary size from the server's metadata
(llama.cpp's `/v1/models` `meta.n_vocab`), which every id it returns must be below
(`collector.episode.tokens`); None where the server does not say (vLLM, SGLang).

The endpoint root is the configured chat base URL without its `/v1`; every POST goes
through `collector.providers.http.Http` (retries, typed errors, secrets scrubbed).

Tests: tests/providers/test_tokenin.py, tests/providers/test_tokenin_servers.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from collector.providers.common import encode_body
from collector.providers.http import Http
from collector.turn import JSONObject, SamplingParams, Turn, TurnRequest

__all__ = ["PARSE_ERRORS", "Rendered", "Seam", "TokenServer", "TokenServerBase", "ints", "sampling_fields"]

PARSE_ERRORS = (KeyError, TypeError, AttributeError, IndexError, ValueError)
"""What reading a reply that is not the dialect's shape raises (turned into a protocol error)."""

Rendered = str | list[int]
"""A template render: text (llama.cpp) or ids (vLLM, SGLang)."""


@dataclass(frozen=True, slots=True)
class Seam:
    """How a turn's output ids end, for the next turn's bridge on ids.

    `stop`: the matched stop string, which the ids hold (vLLM and SGLang trim it from the
    text only). `token`: the stop token that ended the turn (EOS or a stop token id); the
    ids may hold it (vLLM) or not (SGLang trims a matched stop token). Neither: the turn
    ended at the cap, or the server said nothing (the closing follows the ids directly)."""

    stop: str = ""
    token: int | None = None


def ints(value: Any) -> list[int]:
    """`value` as token ids, or ValueError."""
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError("not a list of token ids")
    return value


class TokenServer(Protocol):
    """A token-in dialect (see the module docstring)."""

    proves_on: ClassVar[Literal["text", "ids"]]

    async def render(self, model: str, messages: list[JSONObject], tools: list[JSONObject] | None,
                     extra: dict[str, str]) -> Rendered: ...

    async def tokenize(self, model: str, text: str, add_special: bool,
                       extra: dict[str, str]) -> list[int]: ...

    async def generate(self, request: TurnRequest, prompt: Rendered,
                       extra: dict[str, str]) -> tuple[Turn, Seam]: ...

    async def vocab_size(self, model: str, extra: dict[str, str]) -> int | None: ...


class TokenServerBase:
    """What every dialect shares: the `Http` view and the server root."""

    __slots__ = ("http", "root")

    def __init__(self, http: Http, root: str) -> None:
        self.http = http
        self.root = root

    async def vocab_size(self, model: str, extra: dict[str, str]) -> int | None:
        """The model's vocabulary size, where the server reports one (a dialect overrides)."""
        return None

    async def post(self, path: str, body: JSONObject, extra: dict[str, str]) -> tuple[Any, float]:
        """One POST with the endpoint's retries: the decoded reply and the seconds it took."""
        data = encode_body(body)
        return await self.http.retrying(lambda: self.http.post_json(self.root + path, data, extra))

    async def generate_parsed(self, path: str, body: JSONObject, extra: dict[str, str],
                              parse: Callable[[Any, float], tuple[Turn, Seam]],
                              shape: str) -> tuple[Turn, Seam]:
        """One generation POST whose reply is parsed inside the retry loop, so that a reply
        finished with `abort` is sent again there; a reply not of the
        dialect's shape is a protocol error naming `shape`."""
        data = encode_body(body)
        seams: list[Seam] = []

        async def attempt() -> Turn:
            # A Turn, not the pair: `Http.retrying` reads an abort off the Turn it is handed.
            payload, elapsed = await self.http.post_json(self.root + path, data, extra)
            try:
                turn, seam = parse(payload, elapsed)
            except PARSE_ERRORS:
                raise self.http.protocol_error(f"reply is not {shape}") from None
            seams.append(seam)
            return turn

        turn = await self.http.retrying(attempt)
        return turn, seams[-1]


def sampling_fields(body: JSONObject, p: SamplingParams, seed_field: str = "seed") -> None:
    """The sampling parameters a request sets, under the names vLLM, SGLang and llama.cpp
    share (`temperature`, `top_p`, `stop`; the seed's name differs: SGLang `sampling_seed`)."""
    if p.temperature is not None:
        body["temperature"] = p.temperature
    if p.top_p is not None:
        body["top_p"] = p.top_p
    if p.seed is not None:
        body[seed_field] = p.seed
    if p.stop:
        body["stop"] = list(p.stop)
