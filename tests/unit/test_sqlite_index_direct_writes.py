"""Where the SQLite recall index writes an upsert (issue #8): the documents of a few tens of
turns, the background queue's usual upsert for one session, on the caller's thread in two
small transactions; more on the worker thread, in one.

What a user would notice is the CPU (a hand-off to the thread costs more than the writes;
measured in ``bench/turns.py``); what is checked here is where the statements ran, how
many transactions they took, and that every document is searchable afterwards either way.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tiermem.longterm.index import IndexedDoc
from tiermem.longterm.index_sqlite import SQLiteIndex


@pytest.fixture
async def index(tmp_path: Path) -> AsyncIterator[SQLiteIndex]:
    handle = SQLiteIndex(tmp_path / "tiermem.db", cache_users=0)  # searches read the file
    await handle.collect_expired()  # the worker opens the file and runs the migrations
    yield handle
    await handle.aclose()


def docs(count: int, word: str) -> list[IndexedDoc]:
    now = datetime.now(UTC)
    return [
        IndexedDoc(
            user_id="u-1",
            doc_id=f"{word}-{n}",
            kind="turn",
            text=f"{word} number {n} about seinen manga",
            created_at=now,
        )
        for n in range(count)
    ]


def trace_inserts(index: SQLiteIndex) -> list[int]:
    """The threads that ran each ``INSERT INTO recall_docs`` from now on."""
    threads: list[int] = []
    conn = index._db._engine._direct_connection()

    def seen(statement: str) -> None:
        if statement.startswith("INSERT INTO recall_docs"):
            threads.append(threading.get_ident())

    conn.set_trace_callback(seen)
    return threads


async def test_an_upsert_of_some_tens_of_documents_runs_directly_in_small_writes(
    index: SQLiteIndex,
) -> None:
    threads = trace_inserts(index)
    before = index._db.transactions
    await index.upsert(docs(20, "alpha"))
    assert threads == [threading.get_ident()] * 20  # on the caller's thread
    assert index._db.transactions - before == 2  # of 10 documents each (at most 16)
    hits = await index.search("u-1", "alpha", kinds={"turn"}, limit=50)
    assert {hit.doc_id for hit in hits} == {f"alpha-{n}" for n in range(20)}


async def test_a_larger_upsert_goes_to_the_worker_thread_in_one_write(
    index: SQLiteIndex,
) -> None:
    threads = trace_inserts(index)
    before = index._db.transactions
    await index.upsert(docs(100, "beta"))
    assert len(threads) == 100
    assert threading.get_ident() not in threads
    assert index._db.transactions - before == 1
    hits = await index.search("u-1", "beta", kinds={"turn"}, limit=200)
    assert len(hits) == 100


async def user_stats(index: SQLiteIndex) -> tuple[int, int] | None:
    def op(conn: sqlite3.Connection) -> tuple[int, int] | None:
        row = conn.execute(
            "SELECT docs, total_length FROM recall_users WHERE user_id = 'u-1'"
        ).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    return await index._db.read(op)


@pytest.mark.parametrize("count", [3, 40])  # direct writes, and one write on the thread
async def test_a_document_written_twice_in_one_upsert_is_stored_once_as_last_written(
    index: SQLiteIndex, count: int
) -> None:
    """The stored copies an upsert replaces are looked up once for all its documents; a
    document that comes again later in the same upsert replaces the copy written first."""
    first = docs(count, "gamma")
    again = IndexedDoc(
        user_id="u-1", doc_id="gamma-0", kind="turn", text="delta", created_at=first[0].created_at
    )
    same = first[1]  # the very same document twice: its full-text row is kept
    await index.upsert([*first, again, same])
    hits = await index.search("u-1", "delta", kinds={"turn"}, limit=50)
    assert [hit.doc_id for hit in hits] == ["gamma-0"]
    hits = await index.search("u-1", "gamma", kinds={"turn"}, limit=50)
    assert {hit.doc_id for hit in hits} == {f"gamma-{n}" for n in range(1, count)}
    # Each document counted once, with its last length (gamma-0 is one term now).
    assert await user_stats(index) == (count, 5 * (count - 1) + 1)
    # Written again in a later upsert, with the earlier ones found by the batch lookup.
    await index.upsert([*docs(count, "gamma")[1:], again])
    assert await user_stats(index) == (count, 5 * (count - 1) + 1)
