"""One SQLite connection owned by one worker thread, and the error and time mapping.

Each store owns a :class:`SQLiteDatabase`: a single-thread executor that opens the
connection on first use (pragmas, then migrations) and runs every operation as one
transaction on it. Operations of one store are therefore serialized without a lock, never
block the event loop, and the connection is only ever touched by its own thread. Stores in
other threads or processes sharing the file are serialized by SQLite itself: WAL lets
readers run beside the one writer, and writes start with ``BEGIN IMMEDIATE`` so a
read-modify-write never loses an update.

A caller that is cancelled while its operation runs does not undo it: the transaction
commits or rolls back as a whole, whatever the caller sees.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

from tiermem.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ValidationError,
)
from tiermem.store.backends.sqlite._schema import apply_migrations

__all__ = [
    "DEFAULT_BUSY_TIMEOUT",
    "SQLiteDatabase",
    "from_epoch_us",
    "map_sqlite_error",
    "to_epoch_us",
]

T = TypeVar("T")
Operation = Callable[[sqlite3.Connection], T]

DEFAULT_BUSY_TIMEOUT = timedelta(seconds=5)
"""How long a write waits for another connection's write lock before giving up."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# Primary result codes (the low byte of an extended code) that mean "someone else holds it".
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CANTOPEN = 5, 6, 14


def to_epoch_us(value: datetime, *, what: str = "timestamp") -> int:
    """Microseconds since the epoch, exactly (integer arithmetic, no float rounding).

    Columns use microseconds, the resolution of :class:`datetime`, so that comparing
    columns gives the same answer as comparing the datetimes themselves; milliseconds
    would merge two instants of the same millisecond.

    Raises:
        ValidationError: ``value`` has no timezone.
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(
            f"{what} has no timezone; pass an aware datetime, e.g. datetime.now(UTC)"
        )
    return (value - _EPOCH) // _MICROSECOND


def from_epoch_us(value: int) -> datetime:
    """Invert :func:`to_epoch_us` (the result is in UTC)."""
    return _EPOCH + timedelta(microseconds=value)


def map_sqlite_error(exc: sqlite3.Error, *, path: str, busy_timeout: timedelta) -> BackendError:
    """The tiermem error for a sqlite3 error; the caller raises it ``from exc``."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    message = str(exc)
    locked = primary in (_SQLITE_BUSY, _SQLITE_LOCKED) or (
        primary is None and "database is locked" in message
    )
    if locked:
        return BackendTimeoutError(
            f"SQLite database {path} stayed locked by another writer for more than "
            f"{busy_timeout.total_seconds():g}s ({message}). Retry, or look for a "
            "long-running transaction in another process.",
            backend="sqlite",
        )
    if primary == _SQLITE_CANTOPEN:
        return BackendUnavailableError(
            f"cannot open SQLite database {path} ({message}). Check that its directory "
            "exists and is writable by this user.",
            backend="sqlite",
            retryable=False,
        )
    return BackendError(f"SQLite failed on {path}: {message}", backend="sqlite")


class SQLiteDatabase:
    """A lazily opened connection to a tiermem SQLite file, used from one worker thread."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        role: str,
        busy_timeout: timedelta = DEFAULT_BUSY_TIMEOUT,
    ) -> None:
        text = os.fspath(path)
        if not text or text == ":memory:" or text.startswith("file:"):
            raise ValidationError(
                f"SQLite stores need a database file path, got {text!r}: the hot and "
                "durable stores each open their own connection, which an in-memory "
                "database cannot share. Use default_database_path() or a file of your own."
            )
        self.path = str(Path(text))
        self._busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"tiermem-sqlite-{role}"
        )

    async def read(self, operation: Operation[T]) -> T:
        """Run ``operation`` in a read transaction (one consistent snapshot)."""
        return await self._submit(operation, write=False)

    async def write(self, operation: Operation[T]) -> T:
        """Run ``operation`` in a write transaction; any exception rolls it back."""
        return await self._submit(operation, write=True)

    async def aclose(self) -> None:
        """Close the connection after the operations already submitted have run."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._close)
        finally:
            self._executor.shutdown(wait=False)

    async def _submit(self, operation: Operation[T], *, write: bool) -> T:
        if self._closed:
            raise BackendUnavailableError(
                f"the SQLite store on {self.path} has been closed; open a new one",
                backend="sqlite",
                retryable=False,
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run, operation, write)

    # -- on the worker thread ---------------------------------------------------------------

    def _run(self, operation: Operation[T], write: bool) -> T:
        try:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                result = operation(conn)
                conn.execute("COMMIT")
            except BaseException as exc:
                self._rollback(conn, exc)
                raise
            return result
        except sqlite3.Error as exc:
            raise map_sqlite_error(exc, path=self.path, busy_timeout=self._busy_timeout) from exc

    @staticmethod
    def _rollback(conn: sqlite3.Connection, cause: BaseException) -> None:
        if not conn.in_transaction:  # SQLite may already have rolled back on its own
            return
        try:
            conn.rollback()
        except sqlite3.Error as exc:
            # The original error is the one to report; keep this one beside it.
            cause.add_note(f"rolling back the SQLite transaction failed too: {exc}")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        seconds = self._busy_timeout.total_seconds()
        # isolation_level=None: we issue BEGIN/COMMIT ourselves.
        conn = sqlite3.connect(self.path, timeout=seconds, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")
            mode = _enable_wal(conn, seconds)
            if str(mode).lower() != "wal":
                raise BackendError(
                    f"SQLite file {self.path} cannot use WAL journaling (got {mode!r}); "
                    "put it on a local disk, not a network share.",
                    backend="sqlite",
                )
            # NORMAL is durable across application crashes in WAL mode; only a power loss
            # can drop the last transactions.
            conn.execute("PRAGMA synchronous = NORMAL")
            apply_migrations(conn, path=self.path)
        except BaseException:
            conn.close()
            raise
        return conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


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
