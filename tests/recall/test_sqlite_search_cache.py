"""SQLiteIndex's in-process search cache: the same hits and scores as FTS5, this index's
writes seen at once, another process's (another index on the file) within the TTL."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from tests.recall.conftest import T0
from tiermem.clock import FakeClock
from tiermem.longterm.index import IndexedDoc
from tiermem.longterm.index_sqlite import SQLiteIndex


def _doc(doc_id: str, text: str, **fields: object) -> IndexedDoc:
    return IndexedDoc.model_validate(
        {"user_id": "u1", "doc_id": doc_id, "kind": "turn", "text": text, "created_at": T0} | fields
    )


async def test_cached_search_equals_fts_and_follows_writes(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    cached = SQLiteIndex(tmp_path / "i.db", clock=clock)
    plain = SQLiteIndex(tmp_path / "i.db", clock=clock, cache_users=0)
    try:
        docs = [
            _doc("a", "berserk volume 41 arrived damaged"),
            _doc("b", "berserk box set", expires_at=T0 + timedelta(days=1)),
            _doc("c", "vagabond volume 3 and berserk 2 berserk"),
            _doc("d", "nothing relevant here"),
        ]
        await cached.upsert(docs)
        for query in ("berserk volume", "box", "damaged vagabond"):
            got = await cached.search("u1", query, kinds=("turn",), limit=10)
            want = await plain.search("u1", query, kinds=("turn",), limit=10)
            assert [(h.doc_id, h.score) for h in got] == [
                (h.doc_id, pytest.approx(h.score, abs=1e-9)) for h in want
            ]
        await cached.remove("u1", ["a"])
        await cached.upsert([_doc("e", "berserk deluxe")])
        hits = await cached.search("u1", "berserk", kinds=("turn",), limit=10)
        assert {h.doc_id for h in hits} == {"b", "c", "e"}
        clock.advance(timedelta(days=2))  # "b" expired: hidden at once
        assert "b" not in {
            h.doc_id for h in await cached.search("u1", "box", kinds=("turn",), limit=5)
        }
        await cached.purge_user("u1")
        assert await cached.search("u1", "berserk", kinds=("turn",), limit=10) == []
    finally:
        await cached.aclose()
        await plain.aclose()


async def test_another_writer_is_seen_within_the_ttl(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    reader = SQLiteIndex(tmp_path / "i.db", clock=clock, cache_ttl=timedelta(minutes=5))
    writer = SQLiteIndex(tmp_path / "i.db", clock=clock)
    try:
        await writer.upsert([_doc("a", "frieren volume 1")])
        assert [
            h.doc_id for h in await reader.search("u1", "frieren", kinds=("turn",), limit=5)
        ] == ["a"]
        await writer.upsert([_doc("b", "frieren volume 2")])
        # Cached: the other index's write is not seen yet ...
        assert [
            h.doc_id for h in await reader.search("u1", "frieren", kinds=("turn",), limit=5)
        ] == ["a"]
        clock.advance(timedelta(minutes=5))
        # ... and is once the TTL has passed.
        hits = await reader.search("u1", "frieren", kinds=("turn",), limit=5)
        assert {h.doc_id for h in hits} == {"a", "b"}
    finally:
        await reader.aclose()
        await writer.aclose()


async def test_cached_vector_search_equals_the_file_and_follows_writes(tmp_path: Path) -> None:
    # Vector search keeps each recently queried user's vectors as one float32 matrix
    # instead of reading every vector from the file per query: same hits and scores as
    # the uncached index, this index's writes at once, expiry at once, another writer's
    # within the TTL.
    clock = FakeClock(T0)
    cached = SQLiteIndex(tmp_path / "v.db", clock=clock, cache_ttl=timedelta(minutes=5))
    plain = SQLiteIndex(tmp_path / "v.db", clock=clock, cache_users=0)
    other = SQLiteIndex(tmp_path / "v.db", clock=clock)
    query = (1.0, 0.1, 0.0)

    async def top(index: SQLiteIndex) -> list[tuple[str, float]]:
        hits = await index.vector_search("u1", query, kinds=("turn",), limit=3)
        return [(h.doc_id, round(h.score, 5)) for h in hits]

    try:
        await cached.upsert(
            [
                _doc("a", "a", embedding=(1.0, 0.0, 0.0)),
                _doc("b", "b", embedding=(0.6, 0.8, 0.0), expires_at=T0 + timedelta(hours=1)),
                _doc("c", "c", embedding=(0.0, 0.0, 1.0)),
            ]
        )
        assert await top(cached) == await top(plain)
        assert [d for d, _ in await top(cached)] == ["a", "b", "c"]
        await cached.upsert([_doc("d", "d", embedding=(1.0, 0.1, 0.0))])  # the best match
        assert (await top(cached))[0][0] == "d"
        await cached.remove("u1", ["d"])
        assert "d" not in [d for d, _ in await top(cached)]
        clock.advance(timedelta(hours=2))  # "b" expired: hidden at once
        assert [d for d, _ in await top(cached)] == ["a", "c"]
        await other.upsert([_doc("e", "e", embedding=(1.0, 0.1, 0.0))])
        assert "e" not in [d for d, _ in await top(cached)]  # cached, within the TTL
        clock.advance(timedelta(minutes=5))
        assert (await top(cached))[0][0] == "e"
        assert await top(cached) == await top(plain)
        await cached.purge_user("u1")
        assert await top(cached) == []
    finally:
        await cached.aclose()
        await plain.aclose()
        await other.aclose()
