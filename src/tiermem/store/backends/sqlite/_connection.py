"""One SQLite worker thread and connection per database file, shared by the stores of the
process on that file; direct runs of small operations; group commit; the error and time
mapping.

Each store holds a :class:`SQLiteDatabase`, a handle on its file's engine: one connection
on one dedicated thread, which opens it on first use (pragmas, then migrations). The stores
of one process on the same file with the same settings (the durable store, the recall
index, a SQLite hot store) share the engine: their operations queue in one line and commit
together, so an archive append and the recall index's write of earlier turns can share one
transaction instead of taking turns at the file's write lock. A store may bring a setup
(the recall index's migrations), run on the connection before that store's first
operation. Stores with other settings (``synchronous``, ``busy_timeout``) and other
processes have connections of their own and are serialized by SQLite: WAL lets readers run
beside the one writer, and writes start with ``BEGIN IMMEDIATE`` so a read-modify-write
never loses an update. Connections of one process also queue on one lock per file, so that
they hand the file over at once instead of polling in SQLite's busy handler.

**Direct runs.** A thread hand-off costs more than a small operation itself: waking the
thread, switching the GIL and waking the event loop again came to 100–150 µs of CPU per
call, against 30–60 µs for a one-row read or a turn's append with its commit. So an
operation its store marks small (``direct=True``: a bounded number of rows) runs on the
calling thread, on a second connection of the engine, when its store has nothing queued
or running (so it still sees every write of that store submitted before it) and, for a
write, the file's in-process write lock is free. A write is marked small only when it
comes alone (:meth:`SQLiteDatabase.alone`: no other session wrote within the last
:data:`TOGETHER_WINDOW`): writes of many sessions arriving together go to the thread,
where they share commits and the event loop keeps serving the others. After a direct
commit the process leaves the write lock alone for :data:`DIRECT_WRITE_SPACING` (a write
in that time goes to the thread, which waits out the rest), so that another process
waiting for the file in SQLite's busy handler, which polls every few milliseconds, finds
it free: without that gap, one process writing back to back directly starved the other.
The direct connection never waits: its busy timeout is 0, and a file locked by another
process (``SQLITE_BUSY``) sends the operation to the thread, which waits as usual; it
never checkpoints either (the thread runs a passive checkpoint every
:data:`CHECKPOINT_EVERY` direct commits), so the caller's event loop is held only for the
statements themselves. A direct write is still committed before it returns, then yields
once to the event loop. ``synchronous=FULL`` never runs directly: its commits wait for
the disk.

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
import concurrent.futures
import contextlib
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
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

logger = logging.getLogger(__name__)

T = TypeVar("T")
Operation = Callable[[sqlite3.Connection], T]
Setup = Callable[[sqlite3.Connection, str], object]
"""Run once on a new connection before a store's first operation, outside any transaction
(it manages its own): the connection and the file's path."""
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
TOGETHER_WINDOW = 0.002
"""Seconds within which writes of two different writers (sessions) count as arriving
together: then they go to the thread, where they share commits (module docstring)."""
DIRECT_WRITE_SPACING = 0.0005
"""Seconds after a direct commit during which this process leaves the file's write lock
alone (a write then goes to the thread, which waits out the rest): a process writing back
to back directly would leave other processes' writers, polling in SQLite's busy handler,
no gap to take the file in (module docstring)."""
CHECKPOINT_EVERY = 256
"""Direct write commits between two checkpoints run on the thread (direct commits never
checkpoint: a checkpoint may wait on the disk)."""

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


def _is_busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` means another connection holds what we asked for."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    return "locked" in str(exc)


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


class _Pending:
    """How many operations of one handle are submitted and not finished (queued, running
    on the thread, or running directly); guarded by the engine's lock."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class _Call:
    """One queued operation and, once it has run, its outcome."""

    __slots__ = (
        "error",
        "future",
        "loop",
        "operation",
        "pending",
        "settled",
        "setup",
        "value",
        "write",
    )

    def __init__(
        self,
        operation: Operation[Any],
        write: bool,
        setup: Setup | None,
        pending: _Pending,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any],
    ) -> None:
        self.operation = operation
        self.write = write
        self.setup = setup
        self.pending = pending
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


_STOP = object()
"""Queued after the last call: the thread closes the connection and ends."""
_CHECKPOINT = object()
"""Queued after many direct writes: the thread checkpoints the WAL between batches."""
_QUEUE = object()
"""A direct run's answer when the operation must go to the thread after all."""

_EngineKey = tuple[str, Synchronous, timedelta]


class _Engine:
    """The connection to one file (with one set of settings) and the thread that owns it,
    shared by the :class:`SQLiteDatabase` handles of this process (module docstring)."""

    def __init__(self, path: str, busy_timeout: timedelta, synchronous: Synchronous) -> None:
        self.path = path
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        self.handles = 0  # guarded by _ENGINES_GUARD
        self.transactions = 0
        self._conn: sqlite3.Connection | None = None
        self._ready: set[Setup] = set()  # setups run on the connection (thread only)
        # C-implemented: put() is cheap and wakes the thread blocked in get().
        self._queue: queue.SimpleQueue[_Call | object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._write_lock: threading.Lock | None = None
        # Direct runs (module docstring): the lock guarding each handle's _Pending count,
        # the direct connection.
        self._guard = threading.Lock()
        self._direct: sqlite3.Connection | None = None
        self._direct_closed = False
        self._direct_commits = 0
        self._direct_busy = False
        self._direct_done_at = float("-inf")  # when the last direct write committed
        self._last_writer: str | None = None
        self._last_write_at = float("-inf")

    @property
    def queued(self) -> int:
        """Operations waiting for the thread (for tests)."""
        return self._queue.qsize()

    def submit(self, call: _Call) -> None:
        with self._guard:
            call.pending.count += 1
        self._queue.put(call)
        if self._thread is None:
            self._start()

    # -- direct runs, on the caller's thread ------------------------------------------------

    def alone(self, writer: str) -> bool:
        """Whether a write of ``writer`` (a session) comes alone: the previous write was
        the same writer's, or came more than :data:`TOGETHER_WINDOW` ago. Races between
        threads only blur the hint."""
        now = time.monotonic()
        alone = writer == self._last_writer or now - self._last_write_at >= TOGETHER_WINDOW
        self._last_writer, self._last_write_at = writer, now
        return alone

    def run_direct(
        self, operation: Operation[Any], write: bool, setup: Setup | None, pending: _Pending
    ) -> Any:
        """Run ``operation`` on the calling thread if its store has nothing queued or
        running (so it still sees every write of that store submitted before it) and, for
        a write, no one holds the file's write lock; return :data:`_QUEUE` when it must go
        to the thread instead.

        Raises:
            Whatever the operation raises; sqlite3 errors mapped.
        """
        if self.synchronous != "NORMAL" or self._conn is None or self._direct_closed:
            return _QUEUE  # FULL fsyncs each commit; the thread opens and migrates the file
        if setup is not None and setup not in self._ready:
            return _QUEUE
        if write and time.monotonic() - self._direct_done_at < DIRECT_WRITE_SPACING:
            return _QUEUE
        with self._guard:
            # The direct connection serves one caller at a time (stores of the file used
            # from several threads at once take turns, or go to the worker).
            if pending.count or self._direct_busy:
                return _QUEUE
            pending.count = 1
            self._direct_busy = True
        try:
            conn = self._direct_connection()
            return (
                self._direct_write(conn, operation) if write else self._direct_read(conn, operation)
            )
        except BaseException as exc:
            error = self._error(exc)
            if error is exc:
                raise
            raise error from exc
        finally:
            with self._guard:
                pending.count -= 1
                self._direct_busy = False

    def _direct_read(self, conn: sqlite3.Connection, operation: Operation[Any]) -> Any:
        try:
            conn.execute("BEGIN")
            value = operation(conn)
            conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            self._rollback(conn, exc)
            if _is_busy(exc):  # rare in WAL (a recovery): the thread waits it out
                return _QUEUE
            raise
        except BaseException as exc:
            self._rollback(conn, exc)
            raise
        return value

    def _direct_write(self, conn: sqlite3.Connection, operation: Operation[Any]) -> Any:
        if self._write_lock is None:
            self._write_lock = _write_lock_for(self.path)
        lock = self._write_lock
        if not lock.acquire(blocking=False):  # another connection of ours is writing
            return _QUEUE
        try:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if _is_busy(exc):  # another process is writing: the thread waits for it
                    return _QUEUE
                raise
            self.transactions += 1
            try:
                value = operation(conn)
                conn.execute("COMMIT")
            except BaseException as exc:
                self._rollback(conn, exc)
                raise
        finally:
            lock.release()
        self._direct_done_at = time.monotonic()
        self._direct_commits += 1
        if self._direct_commits % CHECKPOINT_EVERY == 0:
            self._queue.put(_CHECKPOINT)
        return value

    def _direct_connection(self) -> sqlite3.Connection:
        if self._direct is None:
            # No busy wait (a lock held elsewhere sends the operation to the thread) and
            # no automatic checkpoint (the thread runs them): nothing here waits.
            conn = sqlite3.connect(
                self.path,
                timeout=0,
                isolation_level=None,
                check_same_thread=False,  # callers take turns through _direct_busy
                cached_statements=STATEMENT_CACHE_SIZE,
            )
            try:
                conn.execute("PRAGMA busy_timeout = 0")
                conn.execute(f"PRAGMA synchronous = {self.synchronous}")
                conn.execute("PRAGMA wal_autocheckpoint = 0")
            except BaseException:
                conn.close()
                raise
            self._direct = conn
        return self._direct

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                # A daemon: a process that exits without closing its stores must not hang
                # on an idle thread. A write cut off at exit is one no caller saw committed.
                self._thread = threading.Thread(
                    target=self._serve, name="tiermem-sqlite", daemon=True
                )
                self._thread.start()

    async def aclose(self) -> None:
        """Close the connections after every operation already queued has run."""
        with self._guard:
            direct, self._direct, self._direct_closed = self._direct, None, True
        if direct is not None:  # no direct run is under way: the last handle is closing
            direct.close()
        self._queue.put(_STOP)
        if self._thread is None:
            self._start()
        await asyncio.wrap_future(self._closed)

    # -- on the worker thread ---------------------------------------------------------------

    def _serve(self) -> None:
        """Take what is queued, a batch at a time, until the stop mark."""
        take = self._queue.get
        empty = self._queue.empty
        stopping = False
        while not stopping:
            batch: list[_Call] = []
            item = take()
            checkpoint = False
            while True:
                if item is _STOP:
                    stopping = True
                    break
                if item is _CHECKPOINT:
                    checkpoint = True
                else:
                    batch.append(cast(_Call, item))
                if len(batch) >= MAX_BATCH or empty():
                    break
                item = take()
            if batch:
                self._run(batch)
            if checkpoint:
                self._checkpoint()
        try:
            self._close()
        except BaseException as exc:  # noqa: BLE001 -- the closer hears of it
            self._closed.set_exception(exc)
        else:
            self._closed.set_result(None)

    def _checkpoint(self) -> None:
        """Copy the WAL into the database, then start the WAL over with a one-page write.

        Both under the file's write lock, so that no direct write slips in between (a WAL
        that always has a write after its checkpointed frames never starts over, and grows
        without end); the write that starts the WAL over syncs its header, on this thread
        rather than in some caller's event loop.
        """
        conn = self._conn
        if conn is None:
            return
        if self._write_lock is None:
            self._write_lock = _write_lock_for(self.path)
        lock = self._write_lock
        if not lock.acquire(timeout=self.busy_timeout.total_seconds()):
            return  # the next one catches up
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(f"PRAGMA user_version = {int(version)}")  # the same: page 1 only
            conn.execute("COMMIT")
        except sqlite3.Error as exc:  # the next one, or SQLite's own, catches up
            self._rollback(conn, exc)
            logger.warning("checkpointing SQLite file %s failed: %s", self.path, exc)
        finally:
            lock.release()

    def _run(self, batch: list[_Call]) -> None:
        try:
            self._run_batch(batch)
        except BaseException as exc:  # noqa: BLE001 -- a bug here must not strand callers
            for call in batch:
                if not call.settled:
                    call.fail(exc)
        finally:
            with self._guard:  # before the callers hear, so their next call may go direct
                for call in batch:
                    call.pending.count -= 1
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
        if any(call.setup is not None and call.setup not in self._ready for call in calls):
            calls = self._set_up(conn, calls)
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

    def _set_up(self, conn: sqlite3.Connection, calls: list[_Call]) -> list[_Call]:
        """Run the setups the batch's stores still need; fail the calls of a store whose
        setup failed (it runs again before that store's next operation)."""
        failed: dict[Setup, BaseException] = {}
        for call in calls:
            setup = call.setup
            if setup is None or setup in self._ready or setup in failed:
                continue
            try:
                setup(conn, self.path)
            except BaseException as exc:  # noqa: BLE001 -- that store's callers get it
                self._rollback(conn, exc)
                failed[setup] = self._error(exc)
            else:
                self._ready.add(setup)
        if not failed:
            return calls
        kept: list[_Call] = []
        for call in calls:
            error = failed.get(call.setup) if call.setup is not None else None
            if error is None:
                kept.append(call)
            else:
                call.fail(error)
        return kept

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

        Connections of this process on the same file (stores with other settings) queue
        on the lock, and each gets the file the moment the other commits. Without it they
        would meet in SQLite's busy handler, which polls with sleeps of 1, 2, 5, 10 ms...:
        a lost race would cost milliseconds. Other processes still meet there.

        Raises:
            BackendTimeoutError: another connection of this process held it for
                busy_timeout.
            sqlite3.Error: ``BEGIN IMMEDIATE`` failed (another process held the file).
        """
        if self._write_lock is None:  # once: realpath costs a few system calls
            self._write_lock = _write_lock_for(self.path)
        lock = self._write_lock
        rest = self._direct_done_at + DIRECT_WRITE_SPACING - time.monotonic()
        if rest > 0:  # just after a direct commit: leave other processes their gap
            time.sleep(rest)
        seconds = self.busy_timeout.total_seconds()
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
            mapped = map_sqlite_error(exc, path=self.path, busy_timeout=self.busy_timeout)
            mapped.__cause__ = exc
            return mapped
        return exc

    @staticmethod
    def _deliver(calls: list[_Call]) -> None:
        """One wake-up per event loop for the whole batch."""
        first = calls[0].loop
        if all(call.loop is first for call in calls):  # the common case: one loop
            settled = [call for call in calls if call.settled]
            by_loop = {first: settled} if settled else {}
        else:
            by_loop = {}
            for call in calls:
                if call.settled:
                    by_loop.setdefault(call.loop, []).append(call)
        for loop, done in by_loop.items():
            # A closed loop raises RuntimeError: no one is waiting there any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, done)

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
        seconds = self.busy_timeout.total_seconds()
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


_ENGINES: dict[_EngineKey, _Engine] = {}
_ENGINES_GUARD = threading.Lock()


def _attach(path: str, busy_timeout: timedelta, synchronous: Synchronous) -> _Engine:
    """The engine of ``path`` with these settings, shared by this process's handles."""
    key = (os.path.realpath(path), synchronous, busy_timeout)
    with _ENGINES_GUARD:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = _ENGINES[key] = _Engine(path, busy_timeout, synchronous)
        engine.handles += 1
        return engine


def _detach(engine: _Engine) -> bool:
    """Drop one handle; True when it was the last (the caller closes the engine)."""
    with _ENGINES_GUARD:
        engine.handles -= 1
        if engine.handles > 0:
            return False
        key = (os.path.realpath(engine.path), engine.synchronous, engine.busy_timeout)
        if _ENGINES.get(key) is engine:
            del _ENGINES[key]
        return True


class SQLiteDatabase:
    """A store's handle on a tiermem SQLite file: operations run on the file's shared
    worker thread, writes commit in groups (module docstring).

    ``setup``, when given, runs on the connection before this handle's first operation
    (once per connection, however many handles bring it): the recall index's migrations.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        role: str,
        busy_timeout: timedelta = DEFAULT_BUSY_TIMEOUT,
        synchronous: Synchronous = DEFAULT_SYNCHRONOUS,
        setup: Setup | None = None,
    ) -> None:
        text = os.fspath(path)
        if not text or text == ":memory:" or text.startswith("file:"):
            raise ValidationError(
                f"SQLite stores need a database file path, got {text!r}: the hot and "
                "durable stores each open their own connection, which an in-memory "
                "database cannot share. Use default_database_path() or a file of your own."
            )
        self.path = str(Path(text))
        self.role = role
        self.synchronous = check_synchronous(synchronous)
        self._setup = setup
        self._pending = _Pending()
        self._engine = _attach(self.path, busy_timeout, self.synchronous)
        self._closed = False

    @property
    def transactions(self) -> int:
        """Write transactions begun on the file's shared connection (a lone write's
        included), for tests and benchmarks."""
        return self._engine.transactions

    @property
    def queued(self) -> int:
        """Operations of any store on the file waiting for the thread (for tests)."""
        return self._engine.queued

    def alone(self, writer: str) -> bool:
        """Whether a write of ``writer`` (a session id) may run directly: no other
        writer's write came within :data:`TOGETHER_WINDOW` (module docstring)."""
        return self._engine.alone(writer)

    async def read(self, operation: Operation[T], *, direct: bool = False) -> T:
        """Run ``operation`` in a read transaction (one consistent snapshot).

        ``direct``: the operation is small (a bounded number of rows), so it may run on
        the calling thread when the file is idle (module docstring)."""
        return cast(T, await self._submit(operation, write=False, direct=direct))

    async def write(self, operation: Operation[T], *, direct: bool = False) -> T:
        """Run ``operation`` in a write transaction, committed before this returns; if it
        raises, its changes are rolled back and no one else's are.

        ``direct``: the operation is small, so it may run on the calling thread when the
        file is idle and writes are sparse (module docstring)."""
        return cast(T, await self._submit(operation, write=True, direct=direct))

    async def aclose(self) -> None:
        """Let go of the file; the last handle closes the connection after the operations
        already submitted have run."""
        if self._closed:
            return
        self._closed = True
        if _detach(self._engine):
            await self._engine.aclose()

    async def _submit(self, operation: Operation[Any], *, write: bool, direct: bool) -> Any:
        if self._closed:
            raise BackendUnavailableError(
                f"the SQLite store on {self.path} has been closed; open a new one",
                backend="sqlite",
                retryable=False,
            )
        if direct:
            value = self._engine.run_direct(operation, write, self._setup, self._pending)
            if value is not _QUEUE:
                if write:  # a write is a point where other tasks get their turn
                    await asyncio.sleep(0)
                return value
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._engine.submit(_Call(operation, write, self._setup, self._pending, loop, future))
        return await future


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
