"""One rollout: the episode loop (check order, stop reasons, reward policy) and redaction.

`loop` drives one episode over a `collector.providers` adapter and a `collector.envs`
environment and returns a `collector.record.episode.Episode`; `state` is the running
episode it drives (history, record, settling each call once), `notices` what the model is
told about calls that did not run; `redact` decides what of it may be stored and `tokens`
what of the token capture. Plain asyncio, no Ray.

Tests: tests/episode
"""
