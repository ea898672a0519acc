"""The SQLite recall index writing a chunk of many users' documents (issue #8): what a
chunk on the worker thread holds when many sessions write at once. The stored copies are
looked up, and the users' statistics updated, a few statements for the whole chunk (not one
per user); this checks, on chunks larger than one such statement holds, that statistics
stay exactly what the documents add up to and that searches rank as the in-process index
does, through rewrites with new terms, rewrites with the same terms and expired rewrites.
"""

from __future__ import annotations

import random
import sqlite3
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tiermem.longterm import index_sqlite
from tiermem.longterm.index import DocKind, IndexedDoc
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.index_sqlite import SQLiteIndex
from tiermem.testing import FakeClock

T0 = datetime(2025, 1, 1, tzinfo=UTC)
KINDS: tuple[DocKind, ...] = ("memory", "turn", "chunk")
WORDS = ["berserk", "seinen", "horror", "manga", "order", "volume", "stock", "ships", "vagabond"]


def statistics(path: Path) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    """Each user's stored statistics, and what the user's documents add up to."""
    with closing(sqlite3.connect(path)) as conn:
        stored = {u: (d, t) for u, d, t in conn.execute("SELECT * FROM recall_users")}
        counted = {
            u: (d, t)
            for u, d, t in conn.execute(
                "SELECT user_id, count(*), sum(length) FROM recall_docs GROUP BY user_id"
            )
        }
    return stored, counted


def text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))


@pytest.mark.parametrize("seed", [1, 2])
async def test_chunks_of_hundreds_of_users_keep_statistics_and_rankings(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    clock = FakeClock(T0)
    path = tmp_path / "tiermem.db"
    sqlite = SQLiteIndex(path, clock=clock, cache_users=0)  # every search reads FTS5
    reference = InProcessIndex(clock=clock)
    users = [f"user-{i}" for i in range(300)]  # more than one statement's worth of users
    held: dict[tuple[str, str], str] = {}
    try:
        for _ in range(4):
            batch: list[IndexedDoc] = []
            for user in users:
                for _ in range(rng.randint(1, 2)):
                    doc_id = f"d{rng.randint(0, 3)}"
                    old = held.get((user, doc_id))
                    # Rewritten with its own terms (kept in place), with new ones, or expired.
                    words = old if old is not None and rng.random() < 0.3 else text(rng)
                    expired = rng.random() < 0.1
                    held[(user, doc_id)] = words
                    batch.append(
                        IndexedDoc(
                            user_id=user,
                            doc_id=doc_id,
                            kind="turn",
                            text=words,
                            created_at=clock.now(),
                            expires_at=T0 - timedelta(days=1) if expired else None,
                        )
                    )
            distinct = {(d.user_id, d.doc_id) for d in batch}
            assert len(distinct) > index_sqlite._KEYS_PER_STATEMENT
            await sqlite.upsert(batch)
            await reference.upsert(batch)
            stored, counted = statistics(path)
            assert stored == counted
            clock.advance(timedelta(minutes=1))
        for user in rng.sample(users, 40):
            for query in ("berserk manga", "horror", "order stock ships"):
                got = await sqlite.search(user, query, kinds=KINDS, limit=10)
                want = await reference.search(user, query, kinds=KINDS, limit=10)
                assert [h.doc_id for h in got] == [h.doc_id for h in want]
                assert [h.score for h in got] == pytest.approx([h.score for h in want])
    finally:
        await sqlite.aclose()
        await reference.aclose()
