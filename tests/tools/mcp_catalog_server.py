"""A small real MCP server for the invoker tests, run over stdio by the tests themselves.

Tools: ``lookup`` (healthy), ``slow_search`` (reports progress, then takes 30 s),
``flaky_search`` (fails while the file ``$TIERMEM_TEST_TOOL_STATE/flaky_search`` says
``down``; the test writes ``up`` to let it recover), ``partial_search`` (returns an error
result carrying a partial answer) and ``crash`` (the server process exits). Every call of
``flaky_search`` appends a line to ``flaky_search.calls`` so tests count what reached it.

Every start appends the process id to ``$TIERMEM_TEST_TOOL_STATE/starts``; while the file
``start_delay`` there holds a number of seconds, a start waits that long before serving (a
slow restart).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent

STATE = Path(os.environ["TIERMEM_TEST_TOOL_STATE"])
server = MCPServer("tiermem-test-catalog")


@server.tool()
def lookup(query: str) -> str:
    """Look a title up in the catalog."""
    return f"found {query}"


@server.tool()
async def slow_search(query: str, ctx: Context) -> str:
    """Full-text search that reports its first hit, then takes far too long."""
    await ctx.report_progress(1, 2, f"first hit for {query}")
    await asyncio.sleep(30)
    return f"all hits for {query}"


@server.tool()
def flaky_search(query: str) -> str:
    """Search that fails while its backend is down."""
    with (STATE / "flaky_search.calls").open("a") as calls:
        calls.write(query + "\n")
    if (STATE / "flaky_search").read_text().strip() != "up":
        raise ToolError("search index is down")
    return f"fresh results for {query}"


@server.tool()
def partial_search(query: str) -> CallToolResult:
    """Search that returns the hits it found before a shard failed."""
    return CallToolResult(
        content=[
            TextContent(type="text", text=f"2 of 9 hits for {query}"),
            TextContent(type="text", text="shard 2 timed out"),
        ],
        is_error=True,
    )


@server.tool()
def crash(query: str) -> str:
    """Kill the server process, as a crash would."""
    os._exit(3)


if __name__ == "__main__":
    with (STATE / "starts").open("a") as starts:
        starts.write(f"{os.getpid()}\n")
    delay = STATE / "start_delay"
    if delay.exists():
        time.sleep(float(delay.read_text()))
    server.run("stdio")
