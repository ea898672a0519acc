"""Tenant isolation over every MCP tool: each tool the server lists is called with tenant
B's scope on tenant A's ids, and must neither show nor change anything of A.

The REST side is tests/api/test_isolation.py (every route, from the OpenAPI schema); the
MCP server over HTTP with real keys is tests/interfaces/test_mcp_http.py. This test runs
the server in process (the SDK's in-memory client) with a resolver that answers the
tenant the test chooses, and enumerates the tools from ``tools/list``: a new tool fails the
test until it is classified here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcp import Client

from tiermem.interfaces.mcp_server import build_mcp_server
from tiermem.interfaces.tenancy import TenantScope
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

SECRET = "zqv4410mcp"
QUERY = "locker card"  # what B searches for: matches A's data, is not the secret

# Arguments naming tenant A's ids, per tool. "session": the tool names an existing session
# of A, so B must be told it does not exist; "user": it acts on B's own user of that name.
TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "add_turn": (
        "user",
        {"session_id": "s-1", "user_id": "u-1", "role": "user", "text": "B writes"},
    ),
    "get_context": ("session", {"session_id": "s-1", "user_id": "u-1", "query": QUERY}),
    "remember": ("user", {"user_id": "u-1", "content": "B's own note"}),
    "recall": ("user", {"user_id": "u-1", "query": QUERY, "include_turns": True}),
    "forget": ("user", {"user_id": "u-1", "memory_id": "<A's memory>"}),
    "memory_stats": ("session", {"user_id": "u-1", "session_id": "s-1"}),
}


def _text(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content) + json.dumps(
        getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)
    )


async def _stats(client: Client) -> tuple[Any, ...]:
    """What A can count of its own: memories, sessions, the session's turns."""
    result = await client.call_tool("memory_stats", {"user_id": "u-1", "session_id": "s-1"})
    assert not result.is_error, _text(result)
    data = json.loads(result.content[0].text)
    return data["memories"], data["sessions"], data["session"]["turns"]


async def test_every_mcp_tool_refuses_another_tenants_ids(tmp_path: Path) -> None:
    tenant = {"scope": TenantScope("tenant-a")}
    async with MemoryService.from_settings(
        TierMemSettings(sqlite_path=tmp_path / "t.db")
    ) as memory:
        server = build_mcp_server(memory, lambda ctx: tenant["scope"])
        async with Client(server) as client:
            listed = {tool.name for tool in (await client.list_tools()).tools}
            assert listed == set(TOOLS), f"classify the new tools in this test: {listed}"

            added = await client.call_tool(
                "add_turn",
                {"session_id": "s-1", "user_id": "u-1", "role": "user", "text": f"card {SECRET}"},
            )
            assert not added.is_error, _text(added)
            remembered = await client.call_tool(
                "remember", {"user_id": "u-1", "content": f"locker {SECRET}"}
            )
            assert not remembered.is_error, _text(remembered)
            memory_id = json.loads(remembered.content[0].text)["memory_id"]
            await memory.drain()
            before = await _stats(client)

            tenant["scope"] = TenantScope("tenant-b")
            # Session tools first: B's add_turn creates B's own s-1, which B may then read.
            for name in sorted(listed, key=lambda n: (TOOLS[n][0] != "session", n)):
                kind, args = TOOLS[name]
                args = {k: memory_id if v == "<A's memory>" else v for k, v in args.items()}
                result = await client.call_tool(name, args)
                text = _text(result)
                assert SECRET not in text, f"{name} leaked tenant A's data to B: {text}"
                assert "tenant-a" not in text, (name, text)
                if kind == "session":
                    assert result.is_error, (name, text)
                    assert "not" in text.lower(), (name, text)  # "does not exist" / "no session"
                if name == "forget":
                    assert result.is_error, text  # B has no such memory: A's stays
            await memory.drain()

            tenant["scope"] = TenantScope("tenant-a")
            assert await _stats(client) == before
            hits = await client.call_tool("recall", {"user_id": "u-1", "query": QUERY})
            assert SECRET in _text(hits)  # the query finds A's memory: it survived B's forget
            stored = await memory.tiers.get_turns("tenant-a:s-1", 0, None)
            assert [t.text for t in stored] == [f"card {SECRET}"]  # B's add_turn went to B
