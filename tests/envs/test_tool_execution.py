"""How each tool runs is visible: `Tool.execution` says async, inline or thread, matching where
`run_tool` really runs it, and `collector validate` prints it per tool."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from collector.cli import main
from collector.envs.toolkit import describe_execution, run_tool, tool


async def test_execution_names_where_the_call_really_runs() -> None:
    """A plain tool runs on a thread by default, an `inline` one on the loop's thread, and each says so."""
    loop_thread = threading.get_ident()

    def where() -> bool:
        """True when called on the event loop's thread."""
        return threading.get_ident() == loop_thread

    async def awaited() -> bool:
        """Always on the loop."""
        return threading.get_ident() == loop_thread

    threaded, inline, asynchronous = tool(where), tool(where, inline=True), tool(awaited)
    assert (threaded.execution, inline.execution, asynchronous.execution) == ("thread", "inline", "async")
    assert (await run_tool(threaded, {}, 5.0)).content == "false"
    assert (await run_tool(inline, {}, 5.0)).content == "true"
    assert (await run_tool(asynchronous, {}, 5.0)).content == "true"
    assert describe_execution([threaded, asynchronous]) == "where (thread), awaited (async)"


def test_validate_prints_how_each_tool_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`collector validate` lists the first task's tools with async / inline / thread beside each."""
    config = tmp_path / "c.toml"
    config.write_text('[sweep]\nmodels = ["sim-terse"]\nbudgets = [64]\n[env]\nname = "arithmetic"\n',
                      encoding="utf-8")
    assert main(["validate", str(config)]) == 0
    assert "calculator (inline)" in capsys.readouterr().out
