"""Plain-function tools run on the collector's own bounded threads; hung ones cannot starve the rest."""

from __future__ import annotations

import asyncio
import os
import threading

from collector.envs import toolkit as tools_module
from collector.envs.toolkit import ToolThreads, run_tool, tool


async def _until_released(threads: ToolThreads) -> None:
    for _ in range(2000):  # bounded: the hung functions return as soon as the event is set
        if threads.abandoned == 0:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("abandoned threads were never given back")


async def test_hung_tools_saturate_only_the_tool_threads_and_fail_clearly() -> None:
    """Once every tool thread is held by a timed-out call, the next call is refused with a named cause."""
    release = threading.Event()

    def hang() -> str:
        """Blocks until released."""
        release.wait()
        return "late"

    def quick() -> str:
        """Returns at once."""
        return "ok"

    threads = ToolThreads(2)
    hung, fast = tool(hang), tool(quick)
    try:
        for _ in range(2):
            outcome = await run_tool(hung, {}, 0.02, threads=threads)
            assert (outcome.is_error, outcome.ran) == (True, True)
            assert "timed out" in outcome.content
        assert threads.abandoned == 2
        refused = await run_tool(fast, {}, 5.0, threads=threads)
        assert (refused.is_error, refused.ran) == (True, False)
        assert "all 2 tool threads are held by calls that timed out" in refused.content
        assert await asyncio.to_thread(quick) == "ok"  # asyncio's default executor is untouched
    finally:
        release.set()
    await _until_released(threads)
    assert await run_tool(fast, {}, 5.0, threads=threads) == tools_module.ToolOutcome("ok", False)


async def test_default_tool_threads_are_the_collectors_own() -> None:
    """Without an explicit pool, a plain-function tool runs on the module's named daemon threads."""
    seen: list[threading.Thread] = []

    def where() -> str:
        """Reports its thread."""
        seen.append(threading.current_thread())
        return "ok"

    outcome = await run_tool(tool(where), {}, 5.0)
    assert outcome.content == "ok"
    assert seen[0].name.startswith("collector-tool")
    assert seen[0].daemon
    assert tools_module.DEFAULT_TOOL_THREADS.size == tools_module.SYNC_TOOL_THREADS


async def test_more_hung_tools_than_the_default_executor_leave_threaded_tools_working() -> None:
    """After more hung tools than asyncio's default executor holds, a threaded tool still runs."""
    release = threading.Event()

    def hang() -> str:
        """Blocks until released."""
        release.wait()
        return "late"

    def quick() -> str:
        """Returns at once."""
        return "ok"

    try:
        for _ in range(min(32, (os.cpu_count() or 1) + 4) + 1):  # asyncio's default pool size, plus one
            assert (await run_tool(tool(hang), {}, 0.01)).is_error
        assert (await run_tool(tool(quick), {}, 5.0)).content == "ok"
    finally:
        release.set()
    await _until_released(tools_module.DEFAULT_TOOL_THREADS)


async def test_a_call_cancelled_while_queued_never_runs() -> None:
    """A call whose time runs out before a thread is free is dropped from the queue, not run later."""
    release = threading.Event()
    ran: list[str] = []

    def hang() -> str:
        """Blocks until released."""
        release.wait()
        return "late"

    def record() -> str:
        """Records that it ran."""
        ran.append("x")
        return "ok"

    threads = ToolThreads(1)
    try:
        first = asyncio.ensure_future(run_tool(tool(hang), {}, 5.0, threads=threads))
        await asyncio.sleep(0.01)
        queued = await run_tool(tool(record), {}, 0.02, threads=threads)
        assert "timed out" in queued.content
        assert threads.abandoned == 0  # it never started: no thread was lost to it
    finally:
        release.set()
    assert (await first).content == "late"
    assert (await run_tool(tool(record), {}, 5.0, threads=threads)).content == "ok"
    assert ran == ["x"]
