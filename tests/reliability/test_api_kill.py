"""kill -9 of a real ``tiermem serve`` process (uvicorn, SQLite durable tier) in the middle
of a load from the client SDK: every turn the server acknowledged is in the SQLite file
afterwards, and a restarted server carries on from it with gap-free indexes."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from pathlib import Path

import httpx
import pytest

from tests.interfaces.processes import free_port, start_tiermem, stop
from tests.reliability.store_scan import scan_sqlite
from tiermem.client import AsyncTierMemClient
from tiermem.clock import SystemClock
from tiermem.interfaces.tenancy import KeyStore
from tiermem.models import Turn
from tiermem.store.backends.sqlite import SQLiteDurableStore

pytestmark = pytest.mark.slow

WORKERS = 8
KILL_AFTER = 300
"""Acknowledged turns before the kill: enough that every worker has requests in flight."""
SERVER_ENV = {
    "TIERMEM_API_RATE_LIMIT_PER_MINUTE": "1000000",
    "TIERMEM_API_RATE_LIMIT_BURST": "100000",
}


async def test_kill_9_of_the_api_server_loses_no_acknowledged_turn(tmp_path: Path) -> None:
    _, key = KeyStore(tmp_path / "keys.json").create("tenant-a")
    port = free_port()
    server = start_tiermem(["serve", "--port", str(port)], port, tmp_path, **SERVER_ENV)
    url = f"http://127.0.0.1:{port}"
    acked: dict[str, list[Turn]] = {f"s-{n}": [] for n in range(WORKERS)}
    refused = 0
    enough = asyncio.Event()
    try:
        # Auth is on by default: with a key in the file even loopback needs one.
        async with httpx.AsyncClient(base_url=url) as anonymous:
            refused_anonymous = await anonymous.post("/v1/sessions", json={"user_id": "u-1"})
        assert refused_anonymous.status_code == 401
        # No retries: a request the kill cut off must fail, not be retried elsewhere.
        async with AsyncTierMemClient(url, api_key=key, max_retries=0, timeout=10) as sdk:

            async def load(session_id: str) -> None:
                nonlocal refused
                session = await sdk.open_session("u-1", session_id)
                n = 0
                while True:
                    try:
                        turn = await session.add_turn("user", f"{session_id} turn {n}")
                    except Exception:  # noqa: BLE001 -- the server is gone: the load ends
                        refused += 1
                        return
                    acked[session_id].append(turn)
                    if sum(map(len, acked.values())) >= KILL_AFTER:
                        enough.set()
                    n += 1

            async def kill() -> None:
                await enough.wait()
                server.send_signal(signal.SIGKILL)
                server.wait(timeout=10)

            await asyncio.wait_for(asyncio.gather(kill(), *(load(s) for s in acked)), timeout=300)
    finally:
        if server.poll() is None:
            stop(server)
    assert server.returncode == -signal.SIGKILL
    assert refused == WORKERS  # every worker saw its next request fail

    # The SQLite file as the killed process left it (no clean shutdown, WAL not checkpointed).
    db = tmp_path / "t.db"
    with sqlite3.connect(db) as raw:
        rows = dict(raw.execute("SELECT session_id, count(*) FROM turns GROUP BY session_id"))
    durable = SQLiteDurableStore(db, clock=SystemClock())
    try:
        lost = 0
        for session_id, turns in acked.items():
            stored = f"tenant-a:{session_id}"
            archived = await durable.get_turns(stored, 0, None)
            assert [t.index for t in archived] == list(range(len(archived)))
            assert rows.get(stored, 0) == len(archived)
            by_index = {t.index: t.text for t in archived}
            lost += sum(by_index.get(t.index) != t.text for t in turns)
            # At most the one request in flight at the kill is stored but unacknowledged.
            assert len(turns) <= len(archived) <= len(turns) + 1
        assert lost == 0
        total = sum(map(len, acked.values()))
        assert total >= KILL_AFTER
    finally:
        await durable.aclose()

    # A restarted server on the same file continues every session where the archive ends.
    server = start_tiermem(["serve", "--port", str(port)], port, tmp_path, **SERVER_ENV)
    try:
        async with AsyncTierMemClient(url, api_key=key) as sdk:
            for session_id in acked:
                session = await sdk.open_session("u-1", session_id)
                before = await session.get_turns()
                turn = await session.add_turn("user", "after the restart")
                assert turn.index == len(before)
    finally:
        stop(server)
    # The key is stored hashed: its plaintext (or its secret part) is in no file the server
    # wrote -- keys file, database, log.
    secret = key.split("_", 2)[2]  # tm_<hex key id>_<secret>; the secret may contain "_"
    assert scan_sqlite(db, [key, secret]) == []
    for written in ("keys.json", "server.log"):
        text = (tmp_path / written).read_text(encoding="utf-8", errors="replace")
        assert key not in text
        assert secret not in text
    print(f"\napi kill: {total} acknowledged before SIGKILL, 0 lost")
