"""MCP tools given bad arguments answer a tool error that says what was wrong, in the
caller's own ids, and change nothing (session 14's audit). Before: an argument a tool does
not take was dropped by the SDK (``pinned`` on add_turn vanished and the turn was added
unpinned), a 400,000-character query went to get_context, and an error about a session
named it by its store id (``'tenant-a:s-1'``, the tenant prefix the caller never sees)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from tiermem.interfaces.mcp_server import build_mcp_server
from tiermem.interfaces.tenancy import TenantScope
from tiermem.service import MemoryService
from tiermem.settings import TierMemSettings

CASES: list[tuple[str, str, dict[str, Any], str]] = [
    (
        "add_turn with pinned",
        "add_turn",
        {"session_id": "s-1", "user_id": "u-1", "role": "user", "text": "x", "pinned": True},
        "add_turn takes no argument 'pinned'; its arguments are role, session_id, text, user_id",
    ),
    (
        "recall with kind",
        "recall",
        {"user_id": "u-1", "query": "manga", "kind": "memory"},
        "recall takes no argument 'kind'",
    ),
    (
        "get_context with a huge query",
        "get_context",
        {"session_id": "s-1", "user_id": "u-1", "query": "x " * 200_000},
        "query is 400000 characters; the limit is 4000",
    ),
    (
        "recall with a huge query",
        "recall",
        {"user_id": "u-1", "query": "x" * 5_000},
        "query is 5000 characters; the limit is 4000",
    ),
    (
        "add_turn to another user's session",
        "add_turn",
        {"session_id": "s-1", "user_id": "u-2", "role": "user", "text": "x"},
        "session 's-1' belongs to another user",
    ),
]


def _text(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


async def _stats(client: Client) -> Any:
    result = await client.call_tool("memory_stats", {"user_id": "u-1", "session_id": "s-1"})
    assert not result.is_error, _text(result)
    return json.loads(_text(result))


@pytest.mark.parametrize(
    ("label", "tool", "arguments", "message"), CASES, ids=[c[0] for c in CASES]
)
async def test_a_bad_call_is_a_clear_tool_error_and_changes_nothing(
    tmp_path: Path, label: str, tool: str, arguments: dict[str, Any], message: str
) -> None:
    async with MemoryService.from_settings(
        TierMemSettings(sqlite_path=tmp_path / "t.db")
    ) as memory:
        server = build_mcp_server(memory, lambda ctx: TenantScope("tenant-a"))
        async with Client(server) as client:
            added = await client.call_tool(
                "add_turn", {"session_id": "s-1", "user_id": "u-1", "role": "user", "text": "hi"}
            )
            assert not added.is_error, _text(added)
            before = await _stats(client)
            result = await client.call_tool(tool, arguments)
            assert result.is_error, _text(result)
            assert message in _text(result)
            assert "tenant-a" not in _text(result)
            assert await _stats(client) == before
