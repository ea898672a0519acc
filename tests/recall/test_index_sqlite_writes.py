"""The SQLite index's write side (issue #8): an upsert of many documents keeps each user's
BM25 statistics (``recall_users``) exactly what its documents add up to, whatever the
chunk holds (several users, one document twice, rewrites, expired documents), so full-text
scores stay equal to the in-process index's."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from tests.recall.conftest import T0, days, doc
from tiermem.longterm.index import IndexedDoc
from tiermem.longterm.index_memory import InProcessIndex
from tiermem.longterm.index_sqlite import SQLiteIndex
from tiermem.testing import FakeClock

KINDS = ("memory", "turn", "chunk")


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


async def test_one_upsert_of_many_users_rewrites_and_repeats_keeps_statistics_exact(
    tmp_path: Path,
) -> None:
    clock = FakeClock(T0)
    path = tmp_path / "tiermem.db"
    sqlite = SQLiteIndex(path, clock=clock, cache_users=0)  # every search reads FTS5
    reference = InProcessIndex(clock=clock)
    batches: list[list[IndexedDoc]] = [
        [doc("a", "berserk volume one", user_id="u1"), doc("b", "seinen manga", user_id="u2")],
        [
            doc("a", "berserk volume forty two in stock", user_id="u1"),  # rewritten
            doc("c", "horror is not for me", user_id="u1"),
            doc("c", "horror never", user_id="u1"),  # twice in one upsert: the last wins
            doc("d", "order ships tomorrow", user_id="u2"),
            doc("e", "vagabond", user_id="u3", expires_at=T0 - days(1)),  # expired already
            doc("b", "seinen manga", user_id="u2"),  # the same terms: kept in place
            doc("f", "only one", user_id="u4"),
        ],
        [doc("f", "gone", user_id="u4", expires_at=T0 - days(1))],  # u4's last one expires
    ]
    try:
        for batch in batches:
            await sqlite.upsert(batch)
            await reference.upsert(batch)
            stored, counted = statistics(path)
            assert stored == counted
        assert set(stored) == {"u1", "u2"}
        for user, query in [("u1", "berserk horror volume"), ("u2", "seinen order manga")]:
            got = await sqlite.search(user, query, kinds=KINDS, limit=10)
            want = await reference.search(user, query, kinds=KINDS, limit=10)
            assert [(h.doc_id, round(h.score, 9)) for h in got] == [
                (h.doc_id, round(h.score, 9)) for h in want
            ]
            assert got
    finally:
        await sqlite.aclose()
        await reference.aclose()
