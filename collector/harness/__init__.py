"""Harnesses the collector does not run: a gateway that enforces the stop rules, and their episodes.

- `collector.harness.gateway`: the per-episode model endpoint (its own URL, a token as API key)
  and its server;
- `collector.harness.stream`: streamed replies, text as it comes and calls once classified;
- `collector.harness.session`: one episode's turns under the stop rules;
- `collector.harness.chat_wire`: the OpenAI Chat Completions route's parsing and rendering;
- `collector.harness.env`: the `harness` environment kind and the runner the worker calls.

docs/harnesses.md is the user's guide.

Tests: tests/harness/test_gateway_chat.py, tests/harness/test_session.py,
tests/harness/test_harness_env.py, tests/harness/test_stream.py, tests/harness/test_episode_url.py,
tests/system/harness/test_harness_run.py.
"""
