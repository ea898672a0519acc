"""Helpers of the SQLite store's tests: a raw connection to the file, statement tracing."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from tiermem.store.backends.sqlite import SQLiteDurableStore


@contextmanager
def raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A separate connection to the file, as another process would have."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        yield conn


async def traced(store: SQLiteDurableStore, words: int = 3) -> list[str]:
    """Record every statement the store's own connection runs from now on, by its first
    ``words`` words (but the ``PRAGMA`` switches of the connection between the worker and
    direct runs). The returned list fills as the store runs."""
    statements: list[str] = []

    def record(sql: str) -> None:
        if not sql.startswith("PRAGMA"):
            statements.append(" ".join(sql.split()[:words]))

    def install(conn: sqlite3.Connection) -> None:
        conn.set_trace_callback(record)

    await store._db.read(install)  # on the store's worker thread, which owns the connection
    # Direct runs borrow that connection while the thread is idle (installing again is harmless).
    install(store._db._engine._direct_connection())
    statements.clear()
    return statements
