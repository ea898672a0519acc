"""Interfaces: thin adapters (CLI, REST, MCP, web inspector) over the library."""
