"""The simulated provider: the embedded default model of `collector run` and the suite's test double.

An ASGI app (`app.create_app`) speaking the four wire formats of provider-protocols.md,
streamed and not: Chat Completions, Responses, Anthropic Messages, Gemini; and llama-server's
token endpoints for token-in mode (`completion`, over the reversible `vocab`). Model names pick
presets (`presets.PRESETS`); a policy (`policy`) really works the built-in tasks; a
deterministic tokenizer (`tokenizer`) cuts turns at the output cap and reports the count it
cut by; `truth` states exactly how often each preset's turns are cut at a budget. Served
in-process through `httpx.ASGITransport`, or on loopback by `server.SimServer` /
`server.serve` / `python -m collector.sim`.

Nothing here imports the rest of `collector`: the simulator is a separate program that only
shares the wire formats with the collector.
"""

from collector.sim.app import create_app, simulate
from collector.sim.presets import PRESETS, LengthDist, ModelPreset
from collector.sim.server import SimServer, serve
from collector.sim.truth import (
    binomial_interval,
    episode_truncation_probability,
    turn_cut_probability,
)

__all__ = [
    "PRESETS",
    "LengthDist",
    "ModelPreset",
    "SimServer",
    "binomial_interval",
    "create_app",
    "episode_truncation_probability",
    "serve",
    "simulate",
    "turn_cut_probability",
]
