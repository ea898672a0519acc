"""What only one index does: SQLite migrations, Redis key layout, the warming wrapper."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.conftest import server_url
from tests.recall.conftest import T0, doc, memory
from tiermem.errors import BackendError, ValidationError
from tiermem.longterm.index import IndexedDoc
from tiermem.longterm.index_memory import WarmingIndex
from tiermem.longterm.index_sqlite import INDEX_COMPONENT, INDEX_MIGRATIONS, SQLiteIndex
from tiermem.longterm.recall import memory_doc, memory_loader, turn_docs, turn_loader
from tiermem.models import SessionRef
from tiermem.store.backends.memory import MemoryDurableStore
from tiermem.store.backends.sqlite import SQLiteDurableStore
from tiermem.testing import FakeClock
from tiermem.testing.backend import text_turn

ALL = ("memory", "turn", "chunk")


# -- SQLite ---------------------------------------------------------------------------------


async def test_sqlite_index_shares_the_durable_store_file(tmp_path: Path) -> None:
    path = tmp_path / "tiermem.db"
    store = SQLiteDurableStore(path, clock=FakeClock(T0))
    index = SQLiteIndex(path)
    try:
        record = await store.put_memory(memory("m1", "漫画が好き"))
        await index.upsert([memory_doc(record)])
        assert [h.doc_id for h in await index.search("u1", "漫画", kinds=ALL, limit=5)] == ["m1"]
        assert await store.get_memory("u1", "m1") == record
    finally:
        await index.aclose()
        await store.aclose()
    with sqlite3.connect(path) as conn:
        versions = dict(conn.execute("SELECT component, version FROM schema_versions"))
        user_version = conn.execute("PRAGMA user_version").fetchone()[0]
    assert versions == {INDEX_COMPONENT: len(INDEX_MIGRATIONS)}
    assert user_version >= 1  # the store's own schema bookkeeping is untouched by ours


async def test_sqlite_index_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    first = SQLiteIndex(path)
    await first.upsert([doc("a", "berserk", embedding=(1.0, 0.0))])
    await first.aclose()
    second = SQLiteIndex(path)
    try:
        assert [h.doc_id for h in await second.search("u1", "berserk", kinds=ALL, limit=5)] == ["a"]
        hits = await second.vector_search("u1", (1.0, 0.0), kinds=ALL, limit=5)
        assert [h.doc_id for h in hits] == ["a"]
    finally:
        await second.aclose()


async def test_sqlite_index_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    index = SQLiteIndex(path)
    await index.upsert([doc("a", "x")])
    await index.aclose()
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE schema_versions SET version = 99 WHERE component = ?", (INDEX_COMPONENT,)
        )
    newer = SQLiteIndex(path)
    try:
        with pytest.raises(BackendError, match="recall index schema version 99"):
            await newer.search("u1", "x", kinds=ALL, limit=5)
    finally:
        await newer.aclose()


async def test_sqlite_index_rejects_a_memory_database() -> None:
    with pytest.raises(ValidationError):
        SQLiteIndex(":memory:")


async def test_sqlite_large_upserts_are_split_into_transactions(tmp_path: Path) -> None:
    index = SQLiteIndex(tmp_path / "x.db")
    try:
        await index.upsert([doc(f"d{i}", f"word{i % 7} common") for i in range(1203)])
        hits = await index.search("u1", "word3", kinds=ALL, limit=500)
        assert len(hits) == len([i for i in range(1203) if i % 7 == 3])
        await index.purge_user("u1")
        assert await index.search("u1", "common", kinds=ALL, limit=5) == []
    finally:
        await index.aclose()


# -- Redis ----------------------------------------------------------------------------------


@pytest.mark.redis
async def test_redis_index_keys_live_under_the_users_hash_tag() -> None:
    from tests.backends.redis import fresh_prefix
    from tiermem.longterm.index_redis import RedisIndex

    prefix = fresh_prefix()
    index = RedisIndex.from_url(server_url("redis"), prefix=prefix)
    try:
        await index.upsert([doc("a", "berserk 漫画", user_id="we{ir}d:id")])
        client = index._io.client
        keys = sorted(k.decode() for k in await client.keys(f"{prefix}:*"))
        tag = "{u=we%7Bir%7Dd%3Aid}"
        assert keys
        assert all(k.startswith(f"{prefix}:{tag}:ix:") for k in keys)
        assert f"{prefix}:{tag}:ix:m:t=漫画" in keys
        assert index.keys.posting("we{ir}d:id", "memory", "漫画") in keys
        await index.purge_user("we{ir}d:id")
        assert await client.keys(f"{prefix}:*") == []
    finally:
        await index.aclose()


@pytest.mark.redis
async def test_redis_index_scripts_reload_after_a_script_flush() -> None:
    from tests.backends.redis import fresh_prefix
    from tiermem.longterm.index_redis import RedisIndex

    index = RedisIndex.from_url(server_url("redis"), prefix=fresh_prefix())
    try:
        await index.upsert([doc("a", "berserk")])
        await index._io.client.script_flush()
        assert [h.doc_id for h in await index.search("u1", "berserk", kinds=ALL, limit=5)] == ["a"]
        await index.upsert([doc("b", "berserk")])
    finally:
        await index.aclose()


# -- WarmingIndex -----------------------------------------------------------------------------


class CountingLoader:
    def __init__(self, docs: Sequence[IndexedDoc]) -> None:
        self.docs = list(docs)
        self.calls = 0
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()

    async def __call__(self, user_id: str) -> list[IndexedDoc]:
        self.calls += 1
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        return [d for d in self.docs if d.user_id == user_id]


async def test_warming_index_loads_each_user_once() -> None:
    loader = CountingLoader([doc("a", "berserk"), doc("b", "berserk", user_id="u2")])
    index = WarmingIndex([loader])
    for _ in range(3):
        assert [h.doc_id for h in await index.search("u1", "berserk", kinds=ALL, limit=5)] == ["a"]
    assert loader.calls == 1
    assert index.loads == 1
    await index.vector_search("u2", (1.0,), kinds=ALL, limit=5)
    assert loader.calls == 2


async def test_warming_index_concurrent_first_queries_load_once_and_keep_racing_writes() -> None:
    loader = CountingLoader([doc("a", "berserk old")])
    loader.gate = asyncio.Event()
    index = WarmingIndex([loader])
    searches = [
        asyncio.create_task(index.search("u1", "berserk", kinds=ALL, limit=5)) for _ in range(3)
    ]
    await loader.started.wait()
    await index.upsert([doc("a", "vagabond new")])  # written while the load runs
    await index.upsert([doc("c", "berserk")])
    loader.gate.set()
    results = await asyncio.gather(*searches)
    assert loader.calls == 1
    assert all([h.doc_id for h in r] == ["c"] for r in results)
    assert [h.doc_id for h in await index.search("u1", "vagabond", kinds=ALL, limit=5)] == ["a"]


async def test_warming_index_drops_cold_writes_and_evicts_least_recent() -> None:
    loader = CountingLoader([doc("a", "berserk", user_id=u) for u in ("u1", "u2", "u3")])
    index = WarmingIndex([loader], max_users=2)
    await index.upsert([doc("z", "berserk", user_id="u1")])  # cold: the loader is the truth
    assert [h.doc_id for h in await index.search("u1", "berserk", kinds=ALL, limit=5)] == ["a"]
    await index.search("u2", "berserk", kinds=ALL, limit=5)
    await index.search("u3", "berserk", kinds=ALL, limit=5)
    assert not index.is_warm("u1")
    assert index.is_warm("u2")
    assert index.is_warm("u3")
    await index.search("u1", "berserk", kinds=ALL, limit=5)
    assert loader.calls == 4


async def test_memory_and_turn_loaders_read_the_durable_store() -> None:
    clock = FakeClock(T0)
    store = MemoryDurableStore(clock=clock)
    await store.put_memory(memory("m1", "berserk fan"))
    await store.put_memory(memory("x", "berserk internal", memory_type="_change"))
    await store.register_session(SessionRef(session_id="s1", user_id="u1", created_at=T0))
    turns = await store.append_turns("s1", [text_turn("berserk volume 42")])
    index = WarmingIndex([memory_loader(store), turn_loader(store)])
    hits = await index.search("u1", "berserk", kinds=ALL, limit=5)
    assert sorted(h.doc_id for h in hits) == ["m1", "s1#0"]
    assert turn_docs("u1", "s1", turns)[0].doc_id == "s1#0"


async def test_warming_index_load_failure_is_raised_and_retried() -> None:
    calls = 0

    async def flaky(user_id: str) -> list[IndexedDoc]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise BackendError("down", backend="test", retryable=True)
        return [doc("a", "berserk")]

    index = WarmingIndex([flaky])
    with pytest.raises(BackendError):
        await index.search("u1", "berserk", kinds=ALL, limit=5)
    assert [h.doc_id for h in await index.search("u1", "berserk", kinds=ALL, limit=5)] == ["a"]
