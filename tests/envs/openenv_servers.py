"""Real OpenEnv servers for the tests, built with the `openenv` package's own server classes.

`GuessEnvironment` is a typed-action environment (examples/openenv_guess's game, its action
model `GuessAction`), the `Environment` + `create_app` shape of openenv's own template;
`WarehouseEnvironment` is an MCP-style one (`MCPEnvironment` over a FastMCP server, tools
through list_tools/call_tool).
Both append every action they execute to `EXECUTED`, so a test can show what reached them.
`serve` runs an app with uvicorn on a loopback port in a thread of the test's own process.
Also a server module: ``python -m tests.envs.openenv_servers {port}`` serves the guess game.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn
from fastmcp import FastMCP
from openenv.core.env_server import Action, MCPEnvironment, Observation, State, create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

from collector.envs.openenv_server import free_port

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")
if EXAMPLES not in sys.path:  # the example's game is this module's, served as it ships
    sys.path.append(EXAMPLES)

from openenv_guess.server import GuessAction, GuessObservation  # noqa: E402 - needs EXAMPLES
from openenv_guess.server import GuessEnvironment as ExampleGuess  # noqa: E402

#: Every action an environment of this module executed: (environment, what).
EXECUTED: list[tuple[str, object]] = []
#: Released by a test to let a `GuessEnvironment` step that hangs (guess 9) return.
RELEASE = threading.Event()
#: Set by a `GuessEnvironment` step when it starts to hang.
HANGING = threading.Event()


class GuessEnvironment(ExampleGuess):  # type: ignore[misc]
    """examples/openenv_guess's game (the secret is ``seed % 10 + 1``) that logs every guess,
    pays 0.25 for a wrong one (so the reward modes differ), hangs on 9 and fails on 8."""

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:  # type: ignore[override]
        EXECUTED.append(("guess", action.guess))
        if action.guess == 9:
            HANGING.set()
            RELEASE.wait(30)
        if action.guess == 8:
            raise RuntimeError("unlucky number")
        observation: GuessObservation = super().step(action)
        if not observation.done:
            observation.reward = 0.25
        return observation


def warehouse_server() -> FastMCP:
    mcp = FastMCP("warehouse")

    @mcp.tool()
    def order_status(order_id: str) -> str:
        """The status of an order."""
        EXECUTED.append(("order_status", order_id))
        return {"A-1": "shipped"}.get(order_id, "unknown order")

    @mcp.tool()
    def refund(order_id: str, amount: float) -> str:
        """Refund an amount on an order."""
        EXECUTED.append(("refund", (order_id, amount)))
        return f"refunded {amount} on {order_id}"

    @mcp.tool()
    def cancel(order_id: str) -> str:
        """Cancel an order (this warehouse cannot)."""
        EXECUTED.append(("cancel", order_id))
        raise ValueError(f"order {order_id} has shipped and cannot be cancelled")

    @mcp.tool()
    def check(final_text: str) -> float:
        """The grader's tool: 1.0 when the answer says the order shipped."""
        EXECUTED.append(("check", final_text))
        return 1.0 if "shipped" in final_text else 0.0

    return mcp


class WarehouseEnvironment(MCPEnvironment):  # type: ignore[misc]
    """An MCP-style OpenEnv environment: two tools, no actions of its own."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__(warehouse_server())
        self._state = State(episode_id="", step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        return Observation(metadata={"ready": True}, reward=None, done=False)

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(metadata={"error": "no such action"}, reward=None, done=False)

    @property
    def state(self) -> State:
        return self._state


def guess_app() -> Any:
    return create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess",
                      max_concurrent_envs=8)


def warehouse_app() -> Any:
    return create_app(WarehouseEnvironment, CallToolAction, CallToolObservation, env_name="warehouse",
                      max_concurrent_envs=8)


class Served:
    """An app served by uvicorn in a thread: its URL, and a way to stop it mid-test."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error", lifespan="on",
                                ws="websockets-sansio")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test's OpenEnv server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@contextlib.contextmanager
def serve(app: Any) -> Iterator[Served]:
    served = Served(app)
    served.start()
    try:
        yield served
    finally:
        RELEASE.set()
        served.stop()
        RELEASE.clear()
        HANGING.clear()


if __name__ == "__main__":
    uvicorn.run(guess_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="error")
