"""Fixtures for recall: the search indexes under test, durable stores, a fake embedder.

Indexes: ``in_process`` (the reference), ``sqlite`` (in a temporary file beside a durable
store), ``redis`` (a real server from ``TIERMEM_TEST_REDIS_URL``, a fresh key prefix per
test) and ``redis-cluster`` (the 3-master cluster from ``TIERMEM_TEST_REDIS_CLUSTER_URL``),
each on the test's fake ``clock``. A missing Redis fails the test when
``TIERMEM_REQUIRE_BACKENDS=1``.
"""

from __future__ import annotations

import hashlib
import math
import re
import sqlite3
import unicodedata
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.conftest import server_url
from tiermem.clock import FakeClock
from tiermem.errors import BackendUnavailableError
from tiermem.longterm.index import DocKind, IndexedDoc, SearchIndex
from tiermem.models import MemoryRecord, Provenance

INDEXES = ["in_process", "sqlite", "redis", "redis-cluster"]
T0 = datetime(2030, 1, 1, tzinfo=UTC)


async def open_index(name: str, tmp_path: Path, clock: FakeClock | None = None) -> SearchIndex:
    if name == "in_process":
        from tiermem.longterm.index_memory import InProcessIndex

        return InProcessIndex(clock=clock)
    if name == "sqlite":
        from tiermem.longterm.index_sqlite import SQLiteIndex

        return SQLiteIndex(tmp_path / "tiermem.db", clock=clock)
    if name == "redis":
        from tests.backends.redis import fresh_prefix
        from tiermem.longterm.index_redis import RedisIndex

        return RedisIndex.from_url(server_url("redis"), prefix=fresh_prefix(), clock=clock)
    if name == "redis-cluster":
        from tests.backends.redis import fresh_prefix
        from tiermem.longterm.index_redis import RedisIndex

        return RedisIndex.from_url(
            server_url("redis-cluster"), prefix=fresh_prefix(), clock=clock, cluster=True
        )
    raise ValueError(f"unknown index {name!r}")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture(params=INDEXES)
async def index(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[SearchIndex]:
    opened = await open_index(request.param, tmp_path, clock)
    try:
        yield opened
    finally:
        await opened.aclose()


async def held_doc_ids(index: SearchIndex, user_id: str) -> set[str]:
    """The user's documents the index physically holds, expired ones not yet collected
    included (each index's own storage: what collection must shrink)."""
    if index.name == "in_process":
        from tiermem.longterm.index_memory import InProcessIndex

        assert isinstance(index, InProcessIndex)
        user = index._users.get(user_id)
        return set() if user is None else set(user.docs)
    if index.name == "sqlite":
        from tiermem.longterm.index_sqlite import SQLiteIndex

        assert isinstance(index, SQLiteIndex)
        with sqlite3.connect(index.path) as conn:
            rows = conn.execute(
                "SELECT doc_id FROM recall_docs WHERE user_id = ?", (user_id,)
            ).fetchall()
        return {row[0] for row in rows}
    if index.name == "redis":
        from tiermem.longterm.index_redis import RedisIndex

        assert isinstance(index, RedisIndex)
        client = index._io.client
        docs, terms, _, expiries = index.keys.index(user_id)
        held = set(await client.hkeys(docs)) | set(await client.hkeys(terms))
        held |= set(await client.zrange(expiries, 0, -1))
        return {raw.decode() for raw in held}
    raise TypeError(f"no storage probe for {type(index).__name__}")


def doc(
    doc_id: str,
    text: str,
    *,
    user_id: str = "u1",
    kind: DocKind = "memory",
    embedding: Sequence[float] | None = None,
    tags: Sequence[str] = (),
    at: datetime = T0,
    expires_at: datetime | None = None,
) -> IndexedDoc:
    return IndexedDoc(
        user_id=user_id,
        doc_id=doc_id,
        kind=kind,
        text=text,
        created_at=at,
        embedding=None if embedding is None else tuple(embedding),
        tags=tuple(tags),
        expires_at=expires_at,
    )


def memory(
    memory_id: str,
    content: str,
    *,
    user_id: str = "u1",
    memory_type: str = "preference",
    importance: float = 0.5,
    created_at: datetime = T0,
    **fields: object,
) -> MemoryRecord:
    return MemoryRecord.model_validate(
        {
            "memory_id": memory_id,
            "user_id": user_id,
            "memory_type": memory_type,
            "content": content,
            "importance": importance,
            "created_at": created_at,
            "provenance": Provenance(source="explicit"),
            **fields,
        }
    )


def days(n: float) -> timedelta:
    return timedelta(days=n)


# A deterministic stand-in for a sentence embedder: words map to concepts (synonyms and
# translations share one), each concept to a fixed pseudo-random direction. Paraphrases
# that share no word but share concepts get a high cosine, as with a real model.
CONCEPTS = {
    "horror": ["horror", "scary", "frightening", "creepy", "ホラー", "怖い"],
    "romance": ["romance", "romantic", "love", "恋愛", "ラブコメ"],
    "shipping": ["shipping", "delivery", "deliver", "ship", "courier", "配送", "届く"],
    "price": ["price", "cheap", "expensive", "cost", "discount", "安い", "値段"],
    "ebook": ["ebook", "digital", "kindle", "電子書籍"],
    "cat": ["cat", "cats", "kitten", "猫"],
}
_WORD = re.compile(r"\w+")


class ConceptEmbedder:
    model_id = "test-concepts"
    dimensions = 32

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.fail = False
        self._concept_of = {w: c for c, words in CONCEPTS.items() for w in words}

    def _direction(self, name: str) -> list[float]:
        seed = hashlib.sha256(name.encode()).digest()
        return [(b - 127.5) / 127.5 for b in seed[: self.dimensions]]

    def vector(self, text: str) -> list[float]:
        total = [0.0] * self.dimensions
        normal = unicodedata.normalize("NFKC", text).casefold()
        units = _WORD.findall(normal) + [
            w for w in self._concept_of if not w.isascii() and w in normal
        ]
        for unit in units:
            concept = self._concept_of.get(unit)
            if concept is None:
                continue
            for i, x in enumerate(self._direction(concept)):
                total[i] += x
        norm = math.sqrt(sum(x * x for x in total))
        if norm == 0:
            return self._direction("nothing")
        return [x / norm for x in total]

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        if self.fail:
            raise BackendUnavailableError("embedder down", backend="test")
        return [self.vector(t) for t in texts]
