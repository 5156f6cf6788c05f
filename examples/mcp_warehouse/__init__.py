"""A small MCP tool server for the MCP demo (configs/mcp_demo.toml); see server.py."""
