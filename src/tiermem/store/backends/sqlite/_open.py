"""Opening the connections of a SQLite file: every ``sqlite3.connect`` and pragma of the
backend, in one place (and the ``PRAGMA`` switch of a lent connection in
:mod:`~tiermem.store.backends.sqlite._worker`).

* The worker thread's connection (:func:`open_worker_connection`) waits for locks (the
  busy timeout), switches the file to WAL journaling, sets ``synchronous`` and applies the
  migrations. Direct runs borrow it while the thread is idle.
* The spare connection for direct reads while the thread is busy
  (:func:`open_direct_connection`) never waits: busy timeout 0, so a caller's event loop
  is held only for its statements (:mod:`~tiermem.store.backends.sqlite._connection`).
* The checkpointer thread's (:func:`open_checkpoint_connection`) never waits either, and
  opens an existing file only.

None checkpoints on its own (``wal_autocheckpoint = 0``): the checkpointer thread does,
beside the writes (:mod:`~tiermem.store.backends.sqlite._checkpoint`).

All use ``isolation_level=None``: the backend issues ``BEGIN``/``COMMIT`` itself.
"""

from __future__ import annotations

import sqlite3
import time
from datetime import timedelta
from pathlib import Path

from tiermem.errors import BackendError
from tiermem.store.backends.sqlite._mapping import Synchronous
from tiermem.store.backends.sqlite._schema import apply_migrations

__all__ = [
    "STATEMENT_CACHE_SIZE",
    "WAL_SIZE_LIMIT",
    "open_checkpoint_connection",
    "open_direct_connection",
    "open_worker_connection",
]

STATEMENT_CACHE_SIZE = 512
"""Prepared statements a connection keeps (the sqlite3 default is 128). Statements are
literals, so each is prepared once; the margin covers ``IN (...)`` lists of many lengths."""


def open_worker_connection(
    path: str, busy_timeout: timedelta, synchronous: Synchronous
) -> sqlite3.Connection:
    """The worker thread's connection, in WAL mode and migrated.

    Raises:
        BackendError: the file cannot use WAL journaling (a network share).
        sqlite3.Error: opening, a pragma or a migration failed (the connection is closed).
    """
    seconds = busy_timeout.total_seconds()
    conn = sqlite3.connect(
        path,
        timeout=seconds,
        isolation_level=None,
        check_same_thread=False,  # lent to direct runs, one user at a time (conn_lock)
        cached_statements=STATEMENT_CACHE_SIZE,
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")
        mode = _enable_wal(conn, seconds)
        if str(mode).lower() != "wal":
            raise BackendError(
                f"SQLite file {path} cannot use WAL journaling (got {mode!r}); "
                "put it on a local disk, not a network share.",
                backend="sqlite",
            )
        # A checked literal: NORMAL or FULL (see _mapping).
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute(_SECURE_DELETE)
        apply_migrations(conn, path=path)
    except BaseException:
        conn.close()
        raise
    return conn


def open_direct_connection(path: str, synchronous: Synchronous) -> sqlite3.Connection:
    """The connection for direct runs on callers' threads: no
    busy wait (a lock held elsewhere sends the operation to the thread) and no automatic
    checkpoint, so nothing on it waits. Callers take turns on it (``check_same_thread``
    is off); the worker thread has opened and migrated the file before its first use.

    Raises:
        sqlite3.Error: opening or a pragma failed (the connection is closed).
    """
    conn = sqlite3.connect(
        path,
        timeout=0,
        isolation_level=None,
        check_same_thread=False,
        cached_statements=STATEMENT_CACHE_SIZE,
    )
    try:
        conn.execute("PRAGMA busy_timeout = 0")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute(_SECURE_DELETE)
    except BaseException:
        conn.close()
        raise
    return conn


def open_checkpoint_connection(path: str, synchronous: Synchronous) -> sqlite3.Connection:
    """The checkpointer thread's connection (:mod:`~tiermem.store.backends.sqlite._checkpoint`):
    never waits (busy timeout 0), never checkpoints on its own, and opens an existing file
    only (``mode=rw``: a file removed meanwhile is an error, not a new empty database). Its
    restarts of the WAL truncate the WAL file to :data:`WAL_SIZE_LIMIT`.

    Raises:
        sqlite3.Error: opening or a pragma failed (the connection is closed).
    """
    uri = Path(path).absolute().as_uri() + "?mode=rw"
    conn = sqlite3.connect(uri, uri=True, timeout=0, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 0")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
    except BaseException:
        conn.close()
        raise
    return conn


WAL_SIZE_LIMIT = 8 * 1024 * 1024
"""Bytes the WAL file is cut back to when the checkpointer starts it over: about twice what
it reaches between two checkpoints (1,000-odd pages of 4 KiB), so that only a burst of
large turns, which grows it further, is cut back; without a limit the file would keep its
largest size until the last connection closes. (Cutting it back after every checkpoint
would have the file grown again by the next writes, block by block.)"""

_SECURE_DELETE = "PRAGMA secure_delete = ON"
"""Deleted rows are overwritten, not left in free pages: a purge or redaction leaves no
trace in the file (docs/reliability.md). Many builds (Debian's) default to it; others,
some macOS and Windows builds among them, do not, so every connection asks for it."""


def _enable_wal(conn: sqlite3.Connection, seconds: float) -> str:
    """Switch the file to WAL (once per file; it persists). SQLite answers "locked" at once,
    without the busy handler, when another connection is mid-transaction while the mode
    changes (two stores opening a new file together), so wait for it here."""
    mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0])
    deadline = time.monotonic() + seconds
    while mode.lower() != "wal":
        try:
            mode = str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    return mode
