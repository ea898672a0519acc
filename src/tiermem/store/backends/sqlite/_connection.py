"""One SQLite connection owned by one worker thread, group commit, and the error and time
mapping.

Each store owns a :class:`SQLiteDatabase`: a single-thread executor whose thread opens the
connection on first use (pragmas, then migrations) and is the only one ever to touch it.
Operations of one store are therefore serialized without a lock and never block the event
loop. Stores sharing the file are serialized by SQLite itself: WAL lets readers run beside
the one writer, and writes start with ``BEGIN IMMEDIATE`` so a read-modify-write never
loses an update. Writers of one process also queue on one lock per file, so that they hand
the file over at once instead of polling in SQLite's busy handler.

**Group commit.** Operations queue up while the thread works; it then takes everything
queued (at most :data:`MAX_BATCH`) at once. Its writes share one ``BEGIN IMMEDIATE …
COMMIT``, each inside its own ``SAVEPOINT``: an operation that raises rolls back only its
own changes and fails only its own caller. Every caller of the batch learns its outcome
after the ``COMMIT``, so no write is acknowledged before it is committed. Should the
transaction itself fail (the ``COMMIT``, or an error after which SQLite rolled the whole
transaction back), nothing of the batch was written, and each of its other writes runs
again alone, in its own transaction: one operation can never make another fail. A lone
write runs without a savepoint. The batch's reads need no write lock (WAL): those queued
before its first write share one read transaction ahead of the writes, those queued after
one share another after the commit, so a read always sees every write queued before it.
Outcomes reach each event loop in one wake-up per batch, not one per call: with many
sessions writing at once, the commit, the thread hand-off and the wake-up are shared.

A caller that is cancelled while its operation runs does not undo it: the operation
commits or rolls back with its batch, whatever the caller sees. One cancelled before its
batch starts is skipped.

**Durability.** ``synchronous=NORMAL`` (the default) in WAL mode syncs only at checkpoints:
a committed write survives the process being killed (``kill -9``, a crash), but a power
loss or an OS crash can drop the last transactions. ``FULL`` syncs the WAL on every commit
and survives both, at the cost of one fsync per batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from tiermem.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ValidationError,
)
from tiermem.store.backends.sqlite._schema import apply_migrations

__all__ = [
    "DEFAULT_BUSY_TIMEOUT",
    "DEFAULT_SYNCHRONOUS",
    "MAX_BATCH",
    "SQLiteDatabase",
    "Synchronous",
    "from_epoch_us",
    "map_sqlite_error",
    "to_epoch_us",
]

T = TypeVar("T")
Operation = Callable[[sqlite3.Connection], T]
Synchronous = Literal["NORMAL", "FULL"]

DEFAULT_BUSY_TIMEOUT = timedelta(seconds=5)
"""How long a write waits for another connection's write lock before giving up."""
DEFAULT_SYNCHRONOUS: Synchronous = "NORMAL"
"""Survives a process crash, not a power loss (module docstring)."""
MAX_BATCH = 64
"""Most operations one group transaction runs: bounds how long the first caller of a
batch waits for the last one's work (about 2 ms of statements)."""
STATEMENT_CACHE_SIZE = 512
"""Prepared statements the connection keeps (the sqlite3 default is 128). Statements are
literals, so each is prepared once; the margin covers ``IN (...)`` lists of many lengths."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# Primary result codes (the low byte of an extended code) that mean "someone else holds it".
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CANTOPEN = 5, 6, 14
_SYNCHRONOUS_MODES: tuple[Synchronous, ...] = ("NORMAL", "FULL")


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


def check_synchronous(value: str) -> Synchronous:
    """``value`` as a :data:`Synchronous` mode (case-insensitive).

    Raises:
        ValidationError: it is neither NORMAL nor FULL.
    """
    for mode in _SYNCHRONOUS_MODES:
        if isinstance(value, str) and value.upper() == mode:
            return mode
    raise ValidationError(
        f"sqlite synchronous must be 'NORMAL' or 'FULL', got {value!r}: NORMAL survives "
        "a process crash, FULL a power loss too"
    )


_WRITE_LOCKS: dict[str, threading.Lock] = {}
_WRITE_LOCKS_GUARD = threading.Lock()


def _write_lock_for(path: str) -> threading.Lock:
    """The one in-process write lock of a database file (by its real path), shared by
    every store of this process that writes to it."""
    key = os.path.realpath(path)
    with _WRITE_LOCKS_GUARD:
        lock = _WRITE_LOCKS.get(key)
        if lock is None:
            lock = _WRITE_LOCKS[key] = threading.Lock()
        return lock


class _Call:
    """One queued operation and, once it has run, its outcome."""

    __slots__ = ("error", "future", "loop", "operation", "settled", "value", "write")

    def __init__(
        self,
        operation: Operation[Any],
        write: bool,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any],
    ) -> None:
        self.operation = operation
        self.write = write
        self.loop = loop
        self.future = future
        self.settled = False
        self.value: Any = None
        self.error: BaseException | None = None

    def succeed(self, value: object) -> None:
        self.settled, self.value = True, value

    def fail(self, error: BaseException) -> None:
        self.settled, self.error = True, error


class _TransactionLostError(Exception):
    """An operation's error after which SQLite had rolled back the whole transaction."""

    def __init__(self, call: _Call, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.call, self.cause = call, cause


def _settle(calls: list[_Call]) -> None:
    """On the callers' event loop: hand each caller its outcome (unless it gave up)."""
    for call in calls:
        if call.future.done():  # cancelled meanwhile
            continue
        if call.error is not None:
            call.future.set_exception(call.error)
        else:
            call.future.set_result(call.value)


class SQLiteDatabase:
    """A lazily opened connection to a tiermem SQLite file, used from one worker thread,
    that commits queued writes in groups (module docstring)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        role: str,
        busy_timeout: timedelta = DEFAULT_BUSY_TIMEOUT,
        synchronous: Synchronous = DEFAULT_SYNCHRONOUS,
    ) -> None:
        text = os.fspath(path)
        if not text or text == ":memory:" or text.startswith("file:"):
            raise ValidationError(
                f"SQLite stores need a database file path, got {text!r}: the hot and "
                "durable stores each open their own connection, which an in-memory "
                "database cannot share. Use default_database_path() or a file of your own."
            )
        self.path = str(Path(text))
        self.synchronous = check_synchronous(synchronous)
        self._busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"tiermem-sqlite-{role}"
        )
        self._lock = threading.Lock()
        self._pending: list[_Call] = []
        self._draining = False
        self._write_lock: threading.Lock | None = None
        self.transactions = 0
        """Write transactions begun (a lone write's included), for tests and benchmarks."""

    async def read(self, operation: Operation[T]) -> T:
        """Run ``operation`` in a read transaction (one consistent snapshot)."""
        return cast(T, await self._submit(operation, write=False))

    async def write(self, operation: Operation[T]) -> T:
        """Run ``operation`` in a write transaction, committed before this returns; if it
        raises, its changes are rolled back and no one else's are."""
        return cast(T, await self._submit(operation, write=True))

    async def aclose(self) -> None:
        """Close the connection after the operations already submitted have run."""
        if self._closed:
            return
        self._closed = True
        try:
            # The executor runs tasks in order: any drain already scheduled goes first.
            await asyncio.get_running_loop().run_in_executor(self._executor, self._close)
        finally:
            self._executor.shutdown(wait=False)

    async def _submit(self, operation: Operation[Any], *, write: bool) -> Any:
        if self._closed:
            raise BackendUnavailableError(
                f"the SQLite store on {self.path} has been closed; open a new one",
                backend="sqlite",
                retryable=False,
            )
        loop = asyncio.get_running_loop()
        call = _Call(operation, write, loop, loop.create_future())
        with self._lock:
            self._pending.append(call)
            if not self._draining:
                self._draining = True
                self._executor.submit(self._drain)
        return await call.future

    # -- on the worker thread ---------------------------------------------------------------

    def _drain(self) -> None:
        """Run batches until the queue is empty (a new call schedules the next drain)."""
        while True:
            with self._lock:
                if not self._pending:
                    self._draining = False
                    return
                batch = self._pending[:MAX_BATCH]
                del self._pending[:MAX_BATCH]
            try:
                self._run_batch(batch)
            except BaseException as exc:  # noqa: BLE001 -- a bug here must not strand callers
                for call in batch:
                    if not call.settled:
                        call.fail(exc)
            finally:
                self._deliver(batch)

    def _run_batch(self, batch: list[_Call]) -> None:
        # Reading another thread's future state is a benign race: at worst a call
        # cancelled just now still runs, as one cancelled mid-run does.
        calls = [call for call in batch if not call.future.cancelled()]
        if not calls:
            return
        try:
            conn = self._connection()
        except BaseException as exc:  # noqa: BLE001 -- every caller gets it
            for call in calls:
                call.fail(self._error(exc))
            return
        # Queue order is kept where it matters: a read sees every write queued before it.
        # The reads ahead of the first write run first; the writes commit together; the
        # reads queued after a write run on what they committed.
        first_write = next((i for i, call in enumerate(calls) if call.write), len(calls))
        writes = [call for call in calls if call.write]
        later_reads = [call for call in calls[first_write:] if not call.write]
        if first_write:
            self._run_reads(conn, calls[:first_write])
        if len(writes) == 1:
            self._run_alone(conn, writes[0])
        elif writes:
            self._run_group(conn, writes)
        if later_reads:
            self._run_reads(conn, later_reads)

    def _run_reads(self, conn: sqlite3.Connection, calls: list[_Call]) -> None:
        """Every read in one read transaction: one snapshot, no write lock."""
        for call in calls:
            try:
                if not conn.in_transaction:
                    conn.execute("BEGIN")
                call.succeed(call.operation(conn))
            except BaseException as exc:  # noqa: BLE001 -- the caller gets it
                call.fail(self._error(exc))
        if conn.in_transaction:
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:  # the reads are done; only the snapshot is left
                self._rollback(conn, exc)

    def _begin_write(self, conn: sqlite3.Connection) -> threading.Lock:
        """Take the file's in-process write lock, then ``BEGIN IMMEDIATE``; the caller
        releases the lock once the transaction has ended.

        Stores of this process on the same file (the durable store and the recall index)
        queue on the lock, and each gets the file the moment the other commits. Without it
        they would meet in SQLite's busy handler, which polls with sleeps of 1, 2, 5, 10
        ms...: a lost race would cost milliseconds. Other processes still meet there.

        Raises:
            BackendTimeoutError: another store of this process held it for busy_timeout.
            sqlite3.Error: ``BEGIN IMMEDIATE`` failed (another process held the file).
        """
        if self._write_lock is None:  # once: realpath costs a few system calls
            self._write_lock = _write_lock_for(self.path)
        lock = self._write_lock
        seconds = self._busy_timeout.total_seconds()
        if not lock.acquire(timeout=seconds):
            raise BackendTimeoutError(
                f"SQLite database {self.path} stayed locked by another store of this process "
                f"for more than {seconds:g}s. Retry, or look for a long-running write.",
                backend="sqlite",
            )
        try:
            self.transactions += 1
            conn.execute("BEGIN IMMEDIATE")
        except BaseException:
            lock.release()
            raise
        return lock

    def _run_alone(self, conn: sqlite3.Connection, call: _Call) -> None:
        """One write in its own transaction."""
        try:
            lock = self._begin_write(conn)
            try:
                value = call.operation(conn)
                conn.execute("COMMIT")
            except BaseException as exc:
                self._rollback(conn, exc)
                raise
            finally:
                lock.release()
        except BaseException as exc:  # noqa: BLE001 -- the caller gets it
            call.fail(self._error(exc))
        else:
            call.succeed(value)

    def _run_group(self, conn: sqlite3.Connection, calls: list[_Call]) -> None:
        """Many writes in one transaction, each in its own savepoint."""
        try:
            lock = self._begin_write(conn)
        except BaseException as exc:  # noqa: BLE001 -- every caller gets it
            for call in calls:
                call.fail(self._error(exc))
            return
        done: list[tuple[_Call, object]] = []
        lost: BaseException | None = None
        try:
            for call in calls:
                conn.execute("SAVEPOINT tiermem_call")
                try:
                    value = call.operation(conn)
                except BaseException as exc:
                    if not conn.in_transaction:
                        raise _TransactionLostError(call, exc) from exc
                    conn.execute("ROLLBACK TO tiermem_call")
                    conn.execute("RELEASE tiermem_call")
                    call.fail(self._error(exc))
                else:
                    conn.execute("RELEASE tiermem_call")
                    done.append((call, value))
            conn.execute("COMMIT")
        except BaseException as exc:  # noqa: BLE001 -- settled below, call by call
            self._rollback(conn, exc)
            lost = exc
        finally:
            lock.release()
        if lost is not None:
            # Nothing of the batch is written. The operation that lost the transaction
            # keeps its error; every other write not yet failed runs again on its own.
            if isinstance(lost, _TransactionLostError):
                lost.call.fail(self._error(lost.cause))
            for call in calls:
                if not call.settled:
                    self._run_alone(conn, call)
            return
        for call, value in done:
            call.succeed(value)

    def _error(self, exc: BaseException) -> BaseException:
        """What the caller gets: sqlite3 errors mapped (``from`` the original), others as
        they are."""
        if isinstance(exc, sqlite3.Error):
            mapped = map_sqlite_error(exc, path=self.path, busy_timeout=self._busy_timeout)
            mapped.__cause__ = exc
            return mapped
        return exc

    @staticmethod
    def _deliver(calls: list[_Call]) -> None:
        """One wake-up per event loop for the whole batch."""
        by_loop: dict[asyncio.AbstractEventLoop, list[_Call]] = {}
        for call in calls:
            if call.settled:
                by_loop.setdefault(call.loop, []).append(call)
        for loop, settled in by_loop.items():
            # A closed loop raises RuntimeError: no one is waiting there any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, settled)

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
        conn = sqlite3.connect(
            self.path,
            timeout=seconds,
            isolation_level=None,
            cached_statements=STATEMENT_CACHE_SIZE,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")
            mode = _enable_wal(conn, seconds)
            if str(mode).lower() != "wal":
                raise BackendError(
                    f"SQLite file {self.path} cannot use WAL journaling (got {mode!r}); "
                    "put it on a local disk, not a network share.",
                    backend="sqlite",
                )
            # A checked literal: NORMAL or FULL (module docstring).
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
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
