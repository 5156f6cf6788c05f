"""examples/my_env, the harness-style example: episode context, a tool schema from JSON,
and an audit log that joins `executed_tool_calls` exactly."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from collector.config import LoopConfig
from collector.envs.loading import load_environment
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers.scripted import ScriptedProvider, call, calls, text
from collector.stop import StopReason

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def test_my_env_uses_the_episode_context_and_json_schema_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its audit log names the episode's model and joins executed_tool_calls on (episode_id,
    call_id); the tools.json schema is offered as is and refuses an argument it forbids."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delitem(sys.modules, "my_env", raising=False)
    monkeypatch.delitem(sys.modules, "my_env.env", raising=False)
    audit = tmp_path / "audit.jsonl"
    env = load_environment("my_env:UnitPricesEnv", {"num_tasks": 1, "audit_path": str(audit)})
    task = env.tasks()[0]
    m = task.metadata
    expression = f"{m['qty']} * {m['price']} + {m['shipping']}"
    script = [
        calls(
            call("price_of", {"item": "widget"}, id="p1"),
            call("price_of", {"item": "Widget; drop"}, id="p2"),  # breaks the schema's pattern
            call("calculator", {"expression": expression}, id="c1"),
        ),
        text(str(m["qty"] * m["price"] + m["shipping"])),
    ]
    provider = ScriptedProvider(script)
    spec = EpisodeSpec("run", "sim-terse", "sim", 128, task, sample=0, seed=1)
    episode = await run_episode(spec, provider, env, LoopConfig())
    assert episode.stop_reason is StopReason.DONE
    assert episode.reward == 1.0
    offered = {t.name: t.parameters for t in provider.requests[0].tools}
    schemas = json.loads((EXAMPLES / "my_env" / "tools.json").read_text())
    assert offered["price_of"] == schemas[0]["parameters"]
    refused = next(msg for msg in episode.messages if msg.role == "tool" and msg.call_id == "p2")
    assert refused.is_error
    assert "arguments.item: fails pattern" in refused.text
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert {line["model"] for line in lines} == {"sim-terse"}
    executed = {(episode.episode_id, c.call_id, c.turn_index, c.name) for c in episode.executed_tool_calls}
    assert {(x["episode_id"], x["call_id"], x["turn"], x["tool"]) for x in lines} == executed
    assert {c for _, c, _, _ in executed} == {"p1", "c1"}
