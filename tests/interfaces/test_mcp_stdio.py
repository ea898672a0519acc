"""The MCP server over stdio, as a client sees it: ``python -m tiermem mcp`` spawned and driven
with the official SDK's client. Every tool works; errors come back as tool errors; the
``--tenant`` flag keeps tenants apart on one database."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult

pytestmark = pytest.mark.slow  # each test starts server processes

TOOLS = {"add_turn", "get_context", "remember", "recall", "forget", "memory_stats"}


@asynccontextmanager
async def mcp_stdio(db: Path, *extra: str) -> AsyncIterator[ClientSession]:
    env = {
        **os.environ,
        "TIERMEM_SQLITE_PATH": str(db),
        "TIERMEM_HOT_BACKEND": "memory",
        "TIERMEM_DURABLE_BACKEND": "sqlite",
    }
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "tiermem", "mcp", *extra], env=env
    )
    with (db.parent / "mcp-stderr.log").open("a") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


def text(result: CallToolResult) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def data(result: CallToolResult) -> Any:
    assert not result.is_error, text(result)
    return json.loads(text(result))


async def test_every_tool_over_stdio(tmp_path: Path) -> None:
    async with mcp_stdio(tmp_path / "t.db") as client:
        listed = await client.list_tools()
        assert {t.name for t in listed.tools} == TOOLS
        for tool in listed.tools:
            assert tool.description
            assert "Call" in tool.description
            properties = tool.input_schema["properties"]
            assert all(
                p.get("type") in ("string", "integer", "boolean") for p in properties.values()
            )

        added = data(
            await client.call_tool(
                "add_turn",
                {
                    "session_id": "s-1",
                    "user_id": "u-1",
                    "role": "user",
                    "text": "I prefer seinen. Do you have Berserk vol 42?",
                },
            )
        )
        assert added["index"] == 0
        assert added["entities"]["volume"] == "42"
        second = data(
            await client.call_tool(
                "add_turn",
                {
                    "session_id": "s-1",
                    "user_id": "u-1",
                    "role": "assistant",
                    "text": "Yes, ¥1,200.",
                },
            )
        )
        assert second["index"] == 1

        context = await client.call_tool(
            "get_context", {"session_id": "s-1", "user_id": "u-1", "query": "berserk"}
        )
        assert not context.is_error
        assert "Berserk vol 42" in text(context)
        assert "tokens, from hot" in text(context)
        assert "local:" not in text(context)  # store ids never reach the caller

        memory = data(
            await client.call_tool(
                "remember", {"user_id": "u-1", "content": "Lives in Osaka", "tags": "address"}
            )
        )
        hits = data(await client.call_tool("recall", {"user_id": "u-1", "query": "Osaka"}))
        assert hits["hits"][0]["memory_id"] == memory["memory_id"]
        turns = data(
            await client.call_tool(
                "recall", {"user_id": "u-1", "query": "Berserk", "include_turns": True}
            )
        )
        assert any(h.get("session_id") == "s-1" for h in turns["hits"])

        stats = data(
            await client.call_tool("memory_stats", {"user_id": "u-1", "session_id": "s-1"})
        )
        assert stats["session"]["turns"] == 2
        assert stats["memories"] >= 1

        assert data(
            await client.call_tool("forget", {"user_id": "u-1", "memory_id": memory["memory_id"]})
        ) == {"forgotten": memory["memory_id"]}
        after = data(await client.call_tool("recall", {"user_id": "u-1", "query": "Osaka"}))
        assert all(h.get("memory_id") != memory["memory_id"] for h in after["hits"])


async def test_errors_are_tool_errors_with_the_message(tmp_path: Path) -> None:
    async with mcp_stdio(tmp_path / "t.db") as client:
        cases = [
            ("add_turn", {"session_id": "s", "user_id": "u", "role": "robot", "text": "x"}, "role"),
            ("add_turn", {"session_id": "s", "user_id": "u", "role": "user", "text": " "}, "empty"),
            ("get_context", {"session_id": "nope", "user_id": "u"}, "does not exist"),
            ("forget", {"user_id": "u", "memory_id": "m-none"}, "has no memory"),
            ("remember", {"user_id": "u", "content": "x", "memory_type": "gossip"}, "gossip"),
            ("recall", {"user_id": "u", "query": "x", "k": 0}, "between 1 and 50"),
            ("memory_stats", {"user_id": "u", "session_id": "missing"}, "has no session"),
            (
                "add_turn",
                {"session_id": "s\n1", "user_id": "u", "role": "user", "text": "hi"},
                "control",
            ),
            ("add_turn", {"session_id": "s"}, "user_id"),  # missing arguments
        ]
        for tool, arguments, message in cases:
            result = await client.call_tool(tool, arguments)
            assert result.is_error, (tool, arguments, text(result))
            assert message in text(result), (tool, text(result))
        # A session of one user is not another user's.
        await client.call_tool(
            "add_turn", {"session_id": "s-a", "user_id": "alice", "role": "user", "text": "hi"}
        )
        stolen = await client.call_tool("get_context", {"session_id": "s-a", "user_id": "mallory"})
        assert stolen.is_error
        assert "another user" in text(stolen)


async def test_tenants_over_stdio_are_apart(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    async with mcp_stdio(db, "--tenant", "acme") as acme:
        data(await acme.call_tool("remember", {"user_id": "u-1", "content": "acme secret plan"}))
    async with mcp_stdio(db, "--tenant", "beta") as beta:
        hits = data(await beta.call_tool("recall", {"user_id": "u-1", "query": "secret plan"}))
        assert hits["hits"] == []
        stats = data(await beta.call_tool("memory_stats", {"user_id": "u-1"}))
        assert stats["memories"] == 0
    async with mcp_stdio(db, "--tenant", "acme") as acme:
        hits = data(await acme.call_tool("recall", {"user_id": "u-1", "query": "secret plan"}))
        assert [h["text"] for h in hits["hits"]] == ["acme secret plan"]
