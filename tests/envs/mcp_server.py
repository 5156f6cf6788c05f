"""A small MCP server for the tests, on the official SDK: `python mcp_server.py stdio` or
`python mcp_server.py http PORT` (streamable HTTP on 127.0.0.1); `stdio bad-schema` lists
`calculator` with a self-referencing inputSchema; `stdio flood N` first prints N non-JSON
lines on stdout; `big` answers with as many characters as asked.

Its tools answer the simulator's order-status and arithmetic prompts. `crash` ends the
process mid-call (a server that dies mid-episode); `grade` is the grader hook, reading this
session's state (the orders looked up), and is hidden from the model by the environment.
"""

from __future__ import annotations

import hashlib
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

STATUS = {"A-1": "shipped", "B-2": "delayed"}
LOOKED_UP: list[str] = []

server = MCPServer("test-orders", log_level="WARNING")


@server.tool()
def lookup_order(order_id: str) -> dict[str, str]:
    """The status of an order."""
    if order_id not in STATUS:
        raise ToolError(f"no order {order_id}")
    LOOKED_UP.append(order_id)
    return {"status": STATUS[order_id], "pid": str(os.getpid())}


@server.tool()
def calculator(expression: str) -> str:
    """Evaluate integer arithmetic with + - *."""
    if not all(c in "0123456789+-* ()" for c in expression):
        raise ToolError("only integers and + - *")
    return str(eval(expression, {"__builtins__": {}}))  # the characters are checked above


@server.tool()
def approve(order_id: str) -> str:
    """Approve an action on an order; refused for B-2."""
    if order_id == "B-2":
        raise ToolError("approval refused")
    return "approved"


@server.tool()
def variable(name: str) -> str:
    """The value of one of this process's environment variables."""
    return os.environ.get(name, "<unset>")


@server.tool()
def variable_digest(name: str) -> str:
    """The SHA-256 of one of this process's environment variables: proves the value arrived
    without the result quoting it."""
    return hashlib.sha256(os.environ.get(name, "<unset>").encode()).hexdigest()


@server.tool()
def big(size: int) -> str:
    """A result of `size` characters (a server that answers with a whole file)."""
    return "x" * size


@server.tool()
def crash() -> str:
    """Exit the server process in the middle of the call."""
    print("test-orders: crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool()
def grade(final_text: str) -> float:
    """1.0 when this session looked an order up and the answer names its status."""
    return 1.0 if LOOKED_UP and STATUS[LOOKED_UP[-1]] in final_text else 0.0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "bad-schema":
        # One tool whose inputSchema refers to itself (a server bug seen in the wild): the
        # validator would follow it until RecursionError at the first call.
        server._tool_manager.get_tool("calculator").parameters = {"type": "object", "$ref": "#"}  # type: ignore[union-attr]
    if len(sys.argv) > 3 and sys.argv[2] == "flood":
        # Non-JSON lines on the MCP channel before the server speaks (a library printing its
        # debug output to stdout), one quoting a key: the client logs each line it cannot parse.
        junk = "debug: " + "y" * 500 + " key=" + os.environ.get("MCP_TEST_TOKEN", "") + "\n"
        sys.stdout.write(junk * int(sys.argv[3]))
        sys.stdout.flush()
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
