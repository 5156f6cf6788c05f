"""Public home of the tool decorator: `from collector.tools import tool` keeps working.

The implementation lives with the environments it serves, in `collector.envs.toolkit`.
"""

from collector.envs.base import ToolCallContext
from collector.envs.toolkit import ToolArgumentError, ToolError, tool

__all__ = ["ToolArgumentError", "ToolCallContext", "ToolError", "tool"]
