"""One small task set written three ways, for the conformance test (tests/envs/test_conformance.py).

A shop: each task asks for a quantity of one item; the reward is 1 when the cart holds exactly
that quantity at the end. The environment opens with a reset observation ("The cart is
empty."), offers `add_item(sku, quantity)` and `add_note(text)`, and logs every tool it
executes in `EXECUTED` as ``(form, tool, arguments)``. The three forms:

- `NativeShopEnv`: the collector's own `Environment` API (tools with hand-written schemas);
- `TRLShop` + `trl_shop_reward`: a TRL `environment_factory` class (tools from its public
  methods' type hints and docstrings, the reward read from the instances after the episode);
- `shop_openenv_app()`: an MCP-style OpenEnv server built with openenv's `MCPEnvironment` and
  `create_app` over a FastMCP server, graded by a `grade` tool the model is not offered.

Each is written the way its framework's authors write one; where a framework's own default
would make the model see a different request (FastMCP closes every object schema with
``additionalProperties: false``, TRL's rules cannot), the module says so at the spot.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Annotated, Any

from fastmcp import FastMCP
from fastmcp.tools import Tool as MCPTool
from openenv.core.env_server import Action, MCPEnvironment, Observation, State, create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from pydantic import Field

from collector.envs.base import Environment, EpisodeContext, EpisodeWorld, Task, Tool
from collector.envs.toolkit import tool

ROWS = [
    {"id": f"shop-{i}", "prompt": f"Put {q} of 'A-{i}' in the cart.", "target": q}
    for i, q in enumerate((3, 5, 7))
]
OPENING = "The cart is empty."
"""Every form's reset observation (the loop appends it to the prompt as its own paragraph)."""

#: Every tool execution of every form: (form, tool, arguments).
EXECUTED: list[tuple[str, str, dict[str, Any]]] = []
_LOCK = threading.Lock()  # the OpenEnv server executes on its own thread


def _log(form: str, name: str, arguments: dict[str, Any]) -> None:
    with _LOCK:
        EXECUTED.append((form, name, arguments))


# --- the collector's own API ----------------------------------------------------------------

ADD_ITEM = {
    "type": "object",
    "properties": {
        "sku": {"type": "string", "description": "The item's code, as in the order"},
        "quantity": {"type": "integer", "description": "How many"},
    },
    "required": ["sku", "quantity"],
}
ADD_NOTE = {
    "type": "object",
    "properties": {"text": {"type": "string", "description": "The note"}},
    "required": ["text"],
}


class NativeShopWorld(EpisodeWorld):
    def __init__(self, target: int) -> None:
        self.target = target
        self.total = 0
        self._tools = [
            tool(self.add_item, name="add_item", description="Add items to the cart.",
                 parameters=ADD_ITEM),
            tool(self.add_note, name="add_note", description="Attach a note to the order.",
                 parameters=ADD_NOTE),
        ]

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    @property
    def initial_observation(self) -> str | None:
        return f"\n\n{OPENING}"

    def add_item(self, sku: str, quantity: int) -> str:
        _log("native", "add_item", {"sku": sku, "quantity": quantity})
        self.total += quantity
        return f"cart holds {self.total}"

    def add_note(self, text: str) -> str:
        _log("native", "add_note", {"text": text})
        return "noted"

    def grade(self, final_text: str | None) -> float:
        return 1.0 if self.total == self.target else 0.0


class NativeShopEnv(Environment):
    name = "native-shop"

    def tasks(self) -> Sequence[Task]:
        return [Task(r["id"], r["prompt"], {"target": r["target"]}) for r in ROWS]

    def start(self, task: Task, context: EpisodeContext | None = None) -> NativeShopWorld:
        return NativeShopWorld(int(task.metadata["target"]))


# --- a TRL environment_factory class --------------------------------------------------------


class TRLShop:
    """Written as TRL's docs write one: reset(**row), tools are the documented public methods."""

    def __init__(self) -> None:
        self.total = 0
        self.target = 0

    def reset(self, **kwargs: Any) -> str | None:
        self.target = int(kwargs["target"])
        self.total = 0
        return f"\n\n{OPENING}"  # TRL appends it to the prompt as is: the separator is the class's

    def add_item(self, sku: str, quantity: int) -> str:
        """Add items to the cart.

        Args:
            sku: The item's code, as in the order
            quantity: How many
        """
        _log("trl", "add_item", {"sku": sku, "quantity": quantity})
        self.total += quantity
        return f"cart holds {self.total}"

    def add_note(self, text: str) -> str:
        """Attach a note to the order.

        Args:
            text: The note
        """
        _log("trl", "add_note", {"text": text})
        return "noted"


def trl_shop_reward(environments: list[TRLShop], **kwargs: Any) -> list[float]:
    return [1.0 if env.total == env.target else 0.0 for env in environments]


# --- an OpenEnv server ------------------------------------------------------------------------


class ShopObservation(Observation):
    message: str = Field(default="", description="What the shop says")


class OpenEnvShop(MCPEnvironment):  # type: ignore[misc]
    """An MCP-style OpenEnv environment: one FastMCP server per session, holding its cart."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self.total = 0
        self.target = 0
        super().__init__(self._server())
        self._state = State(episode_id="", step_count=0)

    def _server(self) -> FastMCP:
        mcp = FastMCP("shop")

        def add_item(
            sku: Annotated[str, Field(description="The item's code, as in the order")],
            quantity: Annotated[int, Field(description="How many")],
        ) -> str:
            """Add items to the cart."""
            _log("openenv", "add_item", {"sku": sku, "quantity": quantity})
            self.total += quantity
            return f"cart holds {self.total}"

        def add_note(text: Annotated[str, Field(description="The note")]) -> str:
            """Attach a note to the order."""
            _log("openenv", "add_note", {"text": text})
            return "noted"

        def grade(final_text: str) -> float:
            """The grader's tool (`grade_tool`): 1.0 when the cart holds the target."""
            return 1.0 if self.total == self.target else 0.0

        for function in (add_item, add_note):
            built = MCPTool.from_function(function)
            # FastMCP closes every object schema (`additionalProperties: false`); a TRL class
            # cannot say that, and the model would see a different request. Open it, so the
            # three forms offer the very same tools.
            built.parameters.pop("additionalProperties", None)
            mcp.add_tool(built)
        mcp.add_tool(MCPTool.from_function(grade))
        return mcp

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> ShopObservation:
        self.target = int(kwargs["target"])
        self.total = 0
        return ShopObservation(message=OPENING, reward=None, done=False)

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(metadata={"error": "this shop takes tool calls only"}, reward=None, done=False)

    @property
    def state(self) -> State:
        return self._state


def shop_openenv_app() -> Any:
    return create_app(OpenEnvShop, CallToolAction, CallToolObservation, env_name="shop",
                      max_concurrent_envs=16)


def openenv_tasks() -> list[dict[str, Any]]:
    """`env.options.tasks` for the OpenEnv form: the rows, the target sent to the server's reset."""
    return [{"id": r["id"], "prompt": r["prompt"], "metadata": {"reset": {"target": r["target"]}}}
            for r in ROWS]
