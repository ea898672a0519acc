"""Where the SQLite recall index writes an upsert (issue #8): the documents of a few tens of
turns, the background queue's usual upsert for one session, on the caller's thread in two
small transactions; more on the worker thread, in one.

What a user would notice is the CPU (a hand-off to the thread costs more than the writes;
measured in ``bench/turns.py``); what is checked here is where the statements ran, how
many transactions they took, and that every document is searchable afterwards either way.
"""

from __future__ import annotations

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
