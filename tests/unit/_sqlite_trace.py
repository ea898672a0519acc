"""Statement tracing for the SQLite store's tests: which statements an operation runs."""

from __future__ import annotations

import sqlite3

from tiermem.store.backends.sqlite import SQLiteDurableStore


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
