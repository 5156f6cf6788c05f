"""One rollout: the episode loop (check order, stop reasons, reward policy) and redaction.

`loop` drives one episode over a `collector.providers` adapter and a `collector.envs`
environment and returns a `collector.record.episode.Episode`; `redact` decides what of it may be
stored. Plain asyncio, no Ray.
"""
