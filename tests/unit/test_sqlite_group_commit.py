"""Group commit on the SQLite worker thread without savepoints (issue #8).

A batch of writes first runs in one transaction with no savepoints; only when one of them
raises is that transaction rolled back and the batch run again with a savepoint per write.
These tests hold the worker in a write so that the operations submitted meanwhile reach
it as one batch, then look at what was committed and at the statements the connection ran
(``set_trace_callback`` on the worker's real connection).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from tiermem.errors import ConflictError
from tiermem.store.backends.sqlite._connection import SQLiteDatabase


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[SQLiteDatabase]:
    handle = SQLiteDatabase(tmp_path / "tiermem.db", role="durable")

    def create(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE t (n INTEGER PRIMARY KEY)")

    await handle.write(create)  # the worker opens and migrates the file
    yield handle
    await handle.aclose()


def insert(n: int) -> Callable[[sqlite3.Connection], int]:
    def op(conn: sqlite3.Connection) -> int:
        conn.execute("INSERT INTO t (n) VALUES (?)", (n,))
        return n

    return op


def insert_then_fail(n: int) -> Callable[[sqlite3.Connection], int]:
    """Writes ``n``, then raises: its write must be undone, and only its caller fail."""

    def op(conn: sqlite3.Connection) -> int:
        conn.execute("INSERT INTO t (n) VALUES (?)", (n,))
        raise ConflictError(f"no {n}", expected=0, actual=n)

    return op


async def traced_batch(
    db: SQLiteDatabase, calls: list[Coroutine[Any, Any, int]]
) -> tuple[list[int | BaseException], list[str]]:
    """Run ``calls`` as one batch of the worker (held in a write meanwhile); return their
    outcomes and the statements the worker's connection ran for them."""
    statements: list[str] = []
    release, started = threading.Event(), threading.Event()

    def hold(conn: sqlite3.Connection) -> None:
        conn.set_trace_callback(statements.append)
        started.set()
        release.wait(10)

    holder = asyncio.create_task(db.write(hold))
    await asyncio.to_thread(started.wait, 10)
    results = asyncio.gather(*calls, return_exceptions=True)
    for _ in range(100):  # each call queues before its first real await
        if db.queued == len(calls):
            break
        await asyncio.sleep(0)
    assert db.queued == len(calls)
    del statements[:]  # the holder's
    release.set()
    await holder
    outcomes = await results

    def untrace(conn: sqlite3.Connection) -> None:
        conn.set_trace_callback(None)

    await db.read(untrace)
    return list(outcomes), statements


async def rows(db: SQLiteDatabase) -> list[int]:
    return await db.read(lambda conn: [n for (n,) in conn.execute("SELECT n FROM t ORDER BY n")])


async def test_a_batch_where_no_write_raises_commits_once_without_savepoints(
    db: SQLiteDatabase,
) -> None:
    before = db.transactions
    outcomes, statements = await traced_batch(db, [db.write(insert(n)) for n in range(8)])
    assert outcomes == list(range(8))
    assert await rows(db) == list(range(8))
    assert db.transactions == before + 2  # the holder's and the batch's
    assert not [s for s in statements if "SAVEPOINT" in s or "RELEASE" in s]
    assert statements.count("BEGIN IMMEDIATE") == 1
    assert statements.count("COMMIT") == 2  # the holder's, then the batch's


async def test_a_write_that_raises_is_undone_and_fails_alone(db: SQLiteDatabase) -> None:
    before = db.transactions
    calls = [db.write(insert(n)) for n in range(3)]
    calls.append(db.write(insert_then_fail(3)))
    calls += [db.write(insert(n)) for n in range(4, 7)]
    outcomes, statements = await traced_batch(db, calls)
    failed = outcomes.pop(3)
    assert isinstance(failed, ConflictError)
    assert outcomes == [0, 1, 2, 4, 5, 6]
    # The failed write's row is gone; every other write is committed once.
    assert await rows(db) == [0, 1, 2, 4, 5, 6]
    # The holder's, the first run (rolled back), the run again with savepoints.
    assert db.transactions == before + 3
    assert statements.count("ROLLBACK") == 1
    assert statements.count("ROLLBACK TO tiermem_call") == 1
    assert statements.count("SAVEPOINT tiermem_call") == 7


async def test_writes_after_the_one_that_raised_see_the_writes_before_it(
    db: SQLiteDatabase,
) -> None:
    seen: list[list[int]] = []

    def read_back(conn: sqlite3.Connection) -> int:
        seen.append([n for (n,) in conn.execute("SELECT n FROM t ORDER BY n")])
        conn.execute("INSERT INTO t (n) VALUES (10)")
        return 10

    calls = [db.write(insert(1)), db.write(insert_then_fail(2)), db.write(read_back)]
    outcomes, _ = await traced_batch(db, calls)
    assert outcomes[0] == 1
    assert isinstance(outcomes[1], ConflictError)
    assert outcomes[2] == 10
    # The first try stopped at the failure before it; run with savepoints, it saw the
    # write before the failed one, never the failed one's.
    assert seen == [[1]]
    assert await rows(db) == [1, 10]
