"""Environments: tasks, tools and graders; the built-ins (`arithmetic`, `support_desk`) and MCP.

Tests: tests/envs/.
"""
