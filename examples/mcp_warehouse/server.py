"""A warehouse as an MCP server: order statuses and a calculator, on the official `mcp` SDK.

    python -m mcp_warehouse.server            # stdio (how configs/mcp_demo.toml starts it)
    python -m mcp_warehouse.server http 8765  # streamable HTTP on 127.0.0.1:8765/mcp

The collector's `mcp` environment starts one server process per episode over stdio (one
session per episode, so one episode's lookups never show in another's) and offers the
model the tools below, with the schemas `tools/list` gives. Their names and arguments
(`lookup_order(order_id)`, `calculator(expression)`) are the ones the simulated models use
for "What is the status of order ...?" and "What is ...? Use the calculator tool" prompts,
so the demo runs end to end on the simulator.

Every call arrives with the collector's episode id and call id in its `_meta`. With
`WAREHOUSE_LOG` set (`[env.options] env = { WAREHOUSE_LOG = "/tmp/warehouse.log" }`) the
server appends one line per call with both, which is how an environment's own log joins the
`executed_tool_calls` of the stored episodes on (episode_id, call_id).
"""

from __future__ import annotations

import ast
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

ORDERS = {
    "A-1001": "shipped",
    "A-1002": "delayed",
    "B-2001": "delivered",
    "B-2002": "awaiting stock",
}

server = MCPServer("warehouse", log_level="WARNING")


def _log(ctx: Context, tool: str) -> None:
    path = os.environ.get("WAREHOUSE_LOG")
    if not path:
        return
    meta = ctx.request_context.meta or {}
    episode = meta.get("collector/episode_id", "-")
    call = meta.get("collector/call_id", "-")
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"{tool} episode={episode} call={call}\n")


@server.tool()
def lookup_order(order_id: str, ctx: Context) -> dict[str, str]:
    """The status of an order, by its id (e.g. A-1001)."""
    _log(ctx, "lookup_order")
    if order_id not in ORDERS:
        raise ToolError(f"no order {order_id[:40]}")
    return {"order_id": order_id, "status": ORDERS[order_id]}


@server.tool()
def calculator(expression: str, ctx: Context) -> str:
    """Evaluate integer arithmetic with + - * and parentheses."""
    _log(ctx, "calculator")
    return str(_evaluate(ast.parse(expression, mode="eval").body))


def _evaluate(node: ast.expr) -> int:
    # Never eval(): walk the parsed expression, integers and + - * only.
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult):
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Add):
            return left + right
        return left - right if isinstance(node.op, ast.Sub) else left * right
    raise ToolError("only integers, + - * and parentheses")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
