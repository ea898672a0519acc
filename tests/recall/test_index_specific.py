"""What only one index does: SQLite migrations, the warming wrapper (Redis: test_index_redis)."""

from __future__ import annotations

import asyncio
import logging
import random
import sqlite3
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.recall.conftest import T0, days, doc, memory
from tiermem.errors import BackendError, ValidationError
from tiermem.longterm.index import IndexedDoc
from tiermem.longterm.index_memory import (
    POSTING_SHIFT,
    InProcessIndex,
    WarmingIndex,
    bm25_scores,
    bm25_top,
    top_scores,
)
from tiermem.longterm.index_sqlite import INDEX_COMPONENT, INDEX_MIGRATIONS, SQLiteIndex
from tiermem.longterm.recall import (
    WARM_SESSIONS,
    WARM_TURNS_PER_SESSION,
    memory_doc,
    memory_loader,
    turn_docs,
    turn_loader,
)
from tiermem.longterm.records import CHANGE_LOG_TYPE
from tiermem.longterm.text import bm25_idf, bm25_term
from tiermem.longterm.types import MemoryType, MemoryTypeRegistry
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


async def test_sqlite_index_migrates_a_file_written_before_expiry(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:  # a file as the first index migration left it
        conn.execute(
            "CREATE TABLE schema_versions (component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        for statement in INDEX_MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_versions VALUES (?, 1)", (INDEX_COMPONENT,))
        conn.execute(
            "INSERT INTO recall_docs (id, user_id, doc_id, kind, length, created_at_us) "
            "VALUES (1, 'u1', 'old', 'memory', 1, 0)"
        )
        conn.execute(
            "INSERT INTO recall_fts (rowid, tokens, owner) VALUES (1, 'berserk', ?)",
            (_owner("u1"),),
        )
        conn.execute("INSERT INTO recall_users VALUES ('u1', 1, 1)")
    clock = FakeClock(T0)
    index = SQLiteIndex(path, clock=clock)
    try:
        await index.upsert([doc("t", "berserk", kind="turn", expires_at=T0 + days(1))])
        hits = await index.search("u1", "berserk", kinds=ALL, limit=5)
        assert sorted(h.doc_id for h in hits) == ["old", "t"]
        clock.advance(days(1))
        assert await index.collect_expired() == 1
        assert [h.doc_id for h in await index.search("u1", "berserk", kinds=ALL, limit=5)] == [
            "old"
        ]
    finally:
        await index.aclose()
    with sqlite3.connect(path) as conn:
        versions = dict(conn.execute("SELECT component, version FROM schema_versions"))
    assert versions[INDEX_COMPONENT] == len(INDEX_MIGRATIONS) == 3


def _owner(user_id: str) -> str:
    from tiermem.longterm.index_sqlite import _owner_token

    return _owner_token(user_id)


async def test_sqlite_collection_reads_the_expiry_index_not_the_table(tmp_path: Path) -> None:
    index = SQLiteIndex(tmp_path / "x.db")
    await index.upsert([doc("a", "x")])
    await index.aclose()
    with sqlite3.connect(tmp_path / "x.db") as conn:
        plan = " ".join(
            str(row[-1])
            for row in conn.execute(
                "EXPLAIN QUERY PLAN SELECT user_id, doc_id FROM recall_docs "
                "WHERE expires_at_us <= ? ORDER BY expires_at_us LIMIT ?",
                (0, 10),
            )
        )
    assert "recall_docs_by_expiry" in plan


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


# -- InProcessIndex -----------------------------------------------------------------------


def test_top_scores_orders_ties_by_key_and_filters_past_its_first_pass() -> None:
    scores = {f"d{i:02d}": 1.0 if i < 10 else 0.5 for i in range(30)}
    assert top_scores(scores, 2, lambda key: True) == [("d00", 1.0), ("d01", 1.0)]
    # The best 2 * count are all rejected: the rest is searched.
    assert top_scores(scores, 2, lambda key: key >= "d10") == [("d10", 0.5), ("d11", 0.5)]
    assert top_scores(scores, 5, lambda key: key in {"d29", "d03"}) == [
        ("d03", 1.0),
        ("d29", 0.5),
    ]


def test_bm25_scores_equal_the_formula_for_int_and_bytes_postings() -> None:
    shift = POSTING_SHIFT
    postings = [(2, {"a": 7 * shift + 1, "b": 3 * shift + 2}), (1, {"b": 3 * shift + 1})]
    want_b = bm25_term(bm25_idf(10, 2), 2, 3, 5.0) + bm25_term(bm25_idf(10, 1), 1, 3, 5.0)
    got = bm25_scores(postings, 10, 5.0)
    assert got == {"a": bm25_term(bm25_idf(10, 2), 1, 7, 5.0), "b": want_b}
    as_bytes = [
        (df, {k.encode(): str(v).encode() for k, v in posting.items()}) for df, posting in postings
    ]
    assert bm25_scores(as_bytes, 10, 5.0) == {k.encode(): v for k, v in got.items()}


async def test_in_process_expiry_heap_stays_proportional_to_documents() -> None:
    clock = FakeClock(T0)
    index = InProcessIndex(clock=clock)
    for i in range(5000):  # one document rewritten with a later expiry each time
        await index.upsert([doc("t", "berserk", kind="turn", expires_at=T0 + days(1 + i))])
    assert index.document_count("u1") == 1
    assert len(index._expiries) <= 2 * 1 + 1024 + 1
    clock.advance(days(5001))
    assert await index.collect_expired() == 1
    assert not index.has_user("u1")


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


class CountingStore:
    """A durable store that counts the calls made to it and the records they returned."""

    def __init__(self, inner: MemoryDurableStore) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.returned: Counter[str] = Counter()
        self.kwargs: dict[str, list[dict[str, Any]]] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            self.kwargs.setdefault(name, []).append(kwargs)
            result = await attr(*args, **kwargs)
            if isinstance(result, list):
                self.returned[name] += len(result)
            return result

        return counted


async def _store_with_history(clock: FakeClock) -> MemoryDurableStore:
    """u1: a year of change log (1,000 entries), 40 memories, 30 sessions of 250 turns."""
    store = MemoryDurableStore(clock=clock)
    for i in range(1000):
        await store.put_memory(
            memory(
                f"c{i}",
                f"change {i} berserk",
                memory_type=CHANGE_LOG_TYPE,
                created_at=T0 - timedelta(hours=i * 8),
                expires_at=T0 + days(365),
            )
        )
    for i in range(40):
        await store.put_memory(
            memory(f"m{i}", f"berserk note {i}", created_at=T0 - timedelta(minutes=i))
        )
    for s in range(30):
        sid = f"s{s:02d}"
        created = T0 - timedelta(hours=30 - s)
        await store.register_session(SessionRef(session_id=sid, user_id="u1", created_at=created))
        for start in range(0, 250, 50):
            batch = [text_turn(f"berserk turn {s} {i}") for i in range(start, start + 50)]
            await store.append_turns(sid, batch, expires_at=T0 + days(1))
    return store


async def test_warming_reads_live_memories_and_recent_turns_only() -> None:
    clock = FakeClock(T0)
    store = CountingStore(await _store_with_history(clock))
    index = WarmingIndex(
        [
            memory_loader(store, clock=clock),  # type: ignore[arg-type]
            turn_loader(store, retention=days(1), clock=clock),  # type: ignore[arg-type]
        ],
        clock=clock,
    )
    hits = await index.search("u1", "berserk", kinds=ALL, limit=100)
    assert hits
    assert all(not h.doc_id.startswith("c") for h in hits)
    # Memories: only registered types were asked for (never the change log), in pages.
    asked = store.kwargs["query_memories"]
    assert all(kw["memory_types"] and CHANGE_LOG_TYPE not in kw["memory_types"] for kw in asked)
    assert not any(kw.get("include_expired") for kw in asked)
    assert store.returned["query_memories"] == 40
    # Turns: the newest sessions, the tail of each, never a whole archive.
    assert store.kwargs["list_sessions"] == [{"limit": WARM_SESSIONS}]
    assert store.calls["tail_turns"] == WARM_SESSIONS
    assert store.calls["get_turns"] == 0
    assert store.returned["tail_turns"] == WARM_SESSIONS * WARM_TURNS_PER_SESSION
    total_read = sum(store.returned.values())
    assert total_read <= 40 + WARM_SESSIONS + WARM_SESSIONS * WARM_TURNS_PER_SESSION


async def test_memory_loader_pages_and_stops_at_its_cap(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(T0)
    inner = MemoryDurableStore(clock=clock)
    for i in range(700):  # 300 of them share one instant: a page must widen to get past it
        at = T0 - timedelta(minutes=i) if i < 400 else T0 - days(1)
        await inner.put_memory(memory(f"m{i:03d}", f"note {i}", created_at=at))
    # Neither expired nor superseded memories are indexed (the oldest of all here).
    older = T0 - days(3)
    await inner.put_memory(memory("gone", "note", created_at=older, expires_at=T0 - days(1)))
    await inner.put_memory(memory("old", "note", created_at=older, invalid_from=T0 - days(1)))
    store = CountingStore(inner)

    load_all = memory_loader(store, clock=clock, page=100)  # type: ignore[arg-type]
    everything = await load_all("u1")
    assert sorted(d.doc_id for d in everything) == sorted(f"m{i:03d}" for i in range(700))
    assert all(kw["limit"] <= 400 for kw in store.kwargs["query_memories"])

    store.kwargs.clear()
    load_capped = memory_loader(store, clock=clock, page=100, max_memories=250)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="tiermem.longterm.recall"):
        capped = await load_capped("u1")
    assert sorted(d.doc_id for d in capped) == sorted(f"m{i:03d}" for i in range(250))
    assert len(store.kwargs["query_memories"]) == 3
    assert "newest 250 memories" in caplog.text


async def test_memory_loader_reads_the_types_registered_at_warm_up() -> None:
    clock = FakeClock(T0)
    store = MemoryDurableStore(clock=clock)
    await store.put_memory(memory("m1", "berserk", memory_type="wishlist"))
    registry = MemoryTypeRegistry()
    load = memory_loader(store, types=registry, clock=clock)
    assert await load("u1") == []
    registry.register(MemoryType("wishlist", None, 0.5))
    assert [d.doc_id for d in await load("u1")] == ["m1"]


async def test_warmed_turns_expire_with_their_retention() -> None:
    clock = FakeClock(T0)
    store = MemoryDurableStore(clock=clock)
    await store.register_session(SessionRef(session_id="s1", user_id="u1", created_at=T0))
    await store.append_turns("s1", [text_turn("berserk volume 42")], expires_at=T0 + days(1))
    index = WarmingIndex([turn_loader(store, retention=days(1), clock=clock)], clock=clock)
    assert [h.doc_id for h in await index.search("u1", "berserk", kinds=ALL, limit=5)] == ["s1#0"]
    clock.advance(days(1))
    assert await index.search("u1", "berserk", kinds=ALL, limit=5) == []
    assert await index.collect_expired() == 1


@pytest.mark.parametrize("seed", range(40))
def test_bm25_top_equals_scoring_everything(seed: int) -> None:
    """The pruned top (terms taken best bound first, lists cut once the top is settled)
    is the plain top of every score, to the bit, whatever the filter."""
    rng = random.Random(seed)
    docs = [f"d{i:03d}" for i in range(rng.randint(5, 300))]
    postings = []
    for _ in range(rng.randint(1, 6)):
        held = rng.sample(docs, rng.randint(1, len(docs)))
        postings.append(
            (len(held), {d: rng.randint(3, 30) * POSTING_SHIFT + rng.randint(1, 3) for d in held})
        )
    count = rng.randint(1, 40)
    hidden = set(rng.sample(docs, rng.randint(0, len(docs) // 2)))

    def keep(doc_id: str) -> bool:
        return doc_id not in hidden

    want = top_scores(bm25_scores(postings, len(docs), 12.5), count, keep)
    assert bm25_top(postings, len(docs), 12.5, count, keep) == want
    groups: list[dict[int, set[str]]] = []
    for _, posting in postings:
        by_value: dict[int, set[str]] = {}
        for doc_id, value in posting.items():
            by_value.setdefault(value, set()).add(doc_id)
        groups.append(by_value)
    assert bm25_top(postings, len(docs), 12.5, count, keep, groups) == want


async def test_in_process_search_equals_scoring_everything_after_rewrites() -> None:
    """Replaced and removed documents leave the postings (and their by-value groups) as if
    the survivors had been written alone."""
    rng = random.Random(3)
    words = [f"w{i}" for i in range(12)]
    index = InProcessIndex()
    fresh = InProcessIndex()
    texts: dict[str, str] = {}
    for round_ in range(6):
        batch = {
            f"d{rng.randrange(80)}": " ".join(rng.choices(words, k=rng.randint(2, 9)))
            for _ in range(60)
        }
        texts.update(batch)
        await index.upsert([doc(d, t) for d, t in batch.items()])
        gone = rng.sample(sorted(texts), 10)
        await index.remove("u1", gone)
        for d in gone:
            del texts[d]
        if round_ == 5:
            await fresh.upsert([doc(d, t) for d, t in texts.items()])
    for query in ("w1", "w2 w3", "w0 w4 w7 w9", " ".join(words)):
        for limit in (1, 5, 30):
            got = await index.search("u1", query, kinds=ALL, limit=limit)
            assert got == await fresh.search("u1", query, kinds=ALL, limit=limit)
