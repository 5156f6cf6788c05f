"""Conformance across forms: one task set as a native `Environment`, a TRL class and an OpenEnv
server (tests/envs/shop_forms.py) gives the same episodes on the same simulator preset and seed.

The OpenEnv server is openenv's own `create_app` under uvicorn, on loopback in a thread of this
process; the simulator is the ASGI app in process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.envs.base import Environment
from collector.envs.loading import load_environment
from collector.stop import StopReason
from tests.envs import shop_forms
from tests.envs.openenv_servers import Served, serve
from tests.envs.simrun import assert_only_whole_turns_ran, collect_on_sim, stats_table

pytestmark = [
    # openenv 0.10's MCP bridge reads `Tool.inputSchema`, which FastMCP 4 renamed (and warns).
    pytest.mark.filterwarnings("ignore:Accessing `Tool.inputSchema` is deprecated"),
]

#: Cells where the presets cut, break and keep turns: sim-sloppy's malformed calls, cuts at
#: small caps, and a cap that lets every turn through.
CELLS = [("sim-sloppy", 20), ("sim-sloppy", 44), ("sim-sloppy", 400), ("sim-verbose", 90)]
SAMPLES = 6


@pytest.fixture
def shop_server() -> Iterator[Served]:
    with serve(shop_forms.shop_openenv_app()) as served:
        yield served


def _forms(url: str, tmp_path: Path) -> dict[str, Environment]:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in shop_forms.ROWS))
    return {
        "native": shop_forms.NativeShopEnv(),
        "trl": load_environment(
            "trl:tests.envs.shop_forms:TRLShop",
            {"task_file": str(rows), "reward": ["tests.envs.shop_forms:trl_shop_reward"]},
        ),
        "openenv": load_environment(
            "openenv", {"url": url, "tasks": shop_forms.openenv_tasks(), "grade_tool": "grade"}
        ),
    }


async def test_one_task_set_in_three_forms_gives_the_same_episodes(
    shop_server: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shop written natively, as a TRL class and as an OpenEnv server offers the model the
    same request, and on the same simulator preset and seed ends every episode with the same
    stop reason and reward, executes the same calls (none from a cut or malformed turn), and
    prints the same `collector stats` truncation table."""
    shop_forms.EXECUTED.clear()
    forms = _forms(shop_server.url, tmp_path)
    runs = {form: await collect_on_sim(env, CELLS, SAMPLES) for form, env in forms.items()}
    native = runs["native"]

    reasons = {e.stop_reason for e in native}
    assert {StopReason.LENGTH, StopReason.MALFORMED_TOOL_CALL, StopReason.DONE} <= reasons
    assert StopReason.ERROR not in reasons, [e.error for e in native if e.error]
    assert {e.reward for e in native} == {0.0, 1.0}  # the table has both outcomes to compare
    first = native[0]
    assert first.messages[0].text.endswith(f"\n\n{shop_forms.OPENING}")

    for form, episodes in runs.items():
        # The same tools (JSON members in any order: the provider's body is the same object).
        assert [json.loads(e.tools) for e in episodes] == [json.loads(e.tools) for e in native], form
        assert [m.text for m in episodes[0].messages if m.role == "user"] == [
            m.text for m in first.messages if m.role == "user"
        ], f"{form}'s prompt differs"
        assert [(e.task_id, e.stop_reason, e.reward) for e in episodes] == [
            (e.task_id, e.stop_reason, e.reward) for e in native
        ], f"{form} ended episodes differently"
        executed = [c for e in episodes for c in e.executed_tool_calls]
        logged = [(name, args) for f, name, args in shop_forms.EXECUTED if f == form]
        assert len(logged) == len(executed), f"{form} executed calls the loop did not run"
        assert sorted(json.dumps(a, sort_keys=True) for _, a in logged) == sorted(
            json.dumps(json.loads(c.arguments_json), sort_keys=True) for c in executed
        )
        assert_only_whole_turns_ran(episodes)

    tables = {form: stats_table(episodes, tmp_path / form, capsys) for form, episodes in runs.items()}
    assert tables["trl"] == tables["native"]
    assert tables["openenv"] == tables["native"]
    for model, budget in CELLS:
        assert any(line.split()[:2] == [model, str(budget)] for line in tables["native"].splitlines())
