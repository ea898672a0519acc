"""The MCP server over streamable HTTP, as a real process on a loopback port
(``python -m tiermem mcp --http``), driven with the SDK's client and with raw HTTP: tenant
keys are required, tenants cannot see each other through any tool, an MCP session is bound
to its key, a revoked key stops working, and a loopback server without keys serves the
``local`` tenant."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.interfaces.processes import free_port, start_tiermem, stop
from tests.interfaces.test_mcp_stdio import data, text
from tiermem.interfaces.tenancy import KeyStore

pytestmark = pytest.mark.slow  # each test starts server processes


@dataclass
class Server:
    url: str
    keys: KeyStore
    process: subprocess.Popen[bytes]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    port = free_port()
    process = start_tiermem(["mcp", "--http", "--port", str(port)], port, tmp_path)
    try:
        yield Server(f"http://127.0.0.1:{port}/mcp", KeyStore(tmp_path / "keys.json"), process)
    finally:
        stop(process)


@asynccontextmanager
async def connect(url: str, key: str | None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}
_ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def raw_post(url: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    return httpx.post(url, content=json.dumps(body), headers={**_ACCEPT, **headers}, timeout=30)


async def test_keys_are_required_and_tenants_are_isolated(server: Server) -> None:
    _, key_a = server.keys.create("tenant-a")
    _, key_b = server.keys.create("tenant-b")

    for headers in (
        {},
        {"Authorization": "Bearer tm_0000000000000000_" + "x" * 43},
        {"Authorization": "Basic abc"},
    ):
        answer = raw_post(server.url, _INIT, headers)
        assert answer.status_code == 401, answer.text
        assert "API key" in answer.json()["message"]

    async with connect(server.url, key_a) as a:
        added = data(
            await a.call_tool(
                "add_turn",
                {"session_id": "s-1", "user_id": "u-1", "role": "user", "text": "Berserk vol 42"},
            )
        )
        assert added["index"] == 0
        mem = data(await a.call_tool("remember", {"user_id": "u-1", "content": "A's secret"}))
        assert data(await a.call_tool("recall", {"user_id": "u-1", "query": "secret"}))["hits"]
        context = await a.call_tool("get_context", {"session_id": "s-1", "user_id": "u-1"})
        assert "Berserk vol 42" in text(context)
        failed = await a.call_tool("forget", {"user_id": "u-1", "memory_id": "m-none"})
        assert failed.is_error
        assert "has no memory" in text(failed)

    async with connect(server.url, key_b) as b:
        # Every tool, with A's ids: nothing of A is visible or changeable.
        recalled = data(await b.call_tool("recall", {"user_id": "u-1", "query": "secret"}))
        assert recalled["hits"] == []
        context = await b.call_tool("get_context", {"session_id": "s-1", "user_id": "u-1"})
        assert context.is_error
        assert "does not exist" in text(context)
        gone = await b.call_tool("forget", {"user_id": "u-1", "memory_id": mem["memory_id"]})
        assert gone.is_error
        stats = data(await b.call_tool("memory_stats", {"user_id": "u-1"}))
        assert (stats["memories"], stats["sessions"]) == (0, 0)
        missing = await b.call_tool("memory_stats", {"user_id": "u-1", "session_id": "s-1"})
        assert missing.is_error
        own = data(
            await b.call_tool(
                "add_turn", {"session_id": "s-1", "user_id": "u-1", "role": "user", "text": "hi"}
            )
        )
        assert own["index"] == 0  # B's own s-1, not A's
        data(await b.call_tool("remember", {"user_id": "u-1", "content": "B's note"}))

    async with connect(server.url, key_a) as a:
        hits = data(await a.call_tool("recall", {"user_id": "u-1", "query": "secret note"}))
        assert [h["text"] for h in hits["hits"]] == ["A's secret"]  # B's forget did nothing
        stats = data(await a.call_tool("memory_stats", {"user_id": "u-1", "session_id": "s-1"}))
        assert stats["session"]["turns"] == 1


async def test_an_mcp_session_is_bound_to_its_key_and_revocation_applies(server: Server) -> None:
    key_id_a, key_a = server.keys.create("tenant-a")
    _, key_b = server.keys.create("tenant-b")
    opened = raw_post(server.url, _INIT, {"Authorization": f"Bearer {key_a}"})
    assert opened.status_code == 200, opened.text
    session_id = opened.headers["mcp-session-id"]
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "recall", "arguments": {"user_id": "u-1", "query": "x"}},
    }
    session_headers = {"mcp-session-id": session_id, "mcp-protocol-version": "2025-06-18"}
    own = raw_post(server.url, call, {"Authorization": f"Bearer {key_a}", **session_headers})
    assert own.status_code == 200, own.text  # the same call with the session's own key works
    hijack = raw_post(server.url, call, {"Authorization": f"Bearer {key_b}", **session_headers})
    assert hijack.status_code == 404

    server.keys.revoke(key_id_a)
    revoked = raw_post(server.url, _INIT, {"Authorization": f"Bearer {key_a}"})
    assert revoked.status_code == 401


async def test_loopback_without_keys_serves_the_local_tenant(server: Server) -> None:
    async with connect(server.url, None) as local:
        data(await local.call_tool("remember", {"user_id": "u-1", "content": "local note"}))
        hits = data(await local.call_tool("recall", {"user_id": "u-1", "query": "note"}))
        assert [h["text"] for h in hits["hits"]] == ["local note"]
    server.keys.create("tenant-a")  # from now on a key is required, even on loopback
    assert raw_post(server.url, _INIT, {}).status_code == 401


async def test_guessing_keys_is_rate_limited_and_bodies_are_capped(server: Server) -> None:
    _, key = server.keys.create("tenant-a")
    good = {"Authorization": f"Bearer {key}"}
    assert raw_post(server.url, _INIT, good).status_code == 200  # verified: now cached
    bad = {"Authorization": "Bearer tm_0000000000000000_" + "x" * 43}
    answers = [raw_post(server.url, _INIT, bad) for _ in range(60)]
    statuses = [a.status_code for a in answers]
    assert set(statuses) == {401, 429}
    assert statuses.count(401) >= 30  # the budget: 30 failed checks per address and minute
    limited = next(a for a in answers if a.status_code == 429)
    assert int(limited.headers["retry-after"]) >= 1
    # A key verified before the guessing keeps working from the same address.
    assert raw_post(server.url, _INIT, good).status_code == 200
    huge = {**_INIT, "padding": "x" * 1_100_000}
    assert raw_post(server.url, huge, good).status_code == 413
