"""The worker thread of one SQLite file: it opens the file's connection, runs the operations
queued by the file's stores in batches, commits each batch's writes together, and
checkpoints the WAL.

Everything that runs on that thread lives here, so that a write's path from the queue to
its ``COMMIT`` and to its caller's event loop reads in one place. The store-facing handle,
the direct runs on the caller's thread and the per-process registry of workers are in
:mod:`~tiermem.store.backends.sqlite._connection`.

**Opening.** The thread opens the connection on its first batch
(:func:`~tiermem.store.backends.sqlite._open.open_worker_connection`: busy timeout, WAL,
``synchronous``, the store's migrations). A store may also bring a setup (the recall
index's migrations), run on the connection before that store's first operation.

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

**The write lock.** Every write of this process on a file, on any connection, first takes
the file's in-process write lock (:func:`write_lock_for`), then ``BEGIN IMMEDIATE``, so a
read-modify-write never loses an update and connections of one process hand the file over
at once instead of polling in SQLite's busy handler. After a direct commit the thread
waits out :data:`DIRECT_WRITE_SPACING` before taking the lock, so that other processes
find the file free.

**Checkpoints.** Commits on the thread let SQLite checkpoint the WAL as usual. Direct
writes never do (they must not wait for the disk in a caller's event loop), so after many
of them the thread is asked for a checkpoint (:meth:`Worker.request_checkpoint`) and runs
it between batches, keeping the WAL from growing without end.
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
from datetime import timedelta
from typing import Any, TypeVar, cast

from tiermem.errors import BackendTimeoutError
from tiermem.store.backends.sqlite._mapping import Synchronous, caller_error
from tiermem.store.backends.sqlite._open import open_worker_connection

__all__ = [
    "DIRECT_WRITE_SPACING",
    "MAX_BATCH",
    "Call",
    "Operation",
    "Pending",
    "Setup",
    "Worker",
    "rollback",
    "write_lock_for",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")
Operation = Callable[[sqlite3.Connection], T]
Setup = Callable[[sqlite3.Connection, str], object]
"""Run once on a new connection before a store's first operation, outside any transaction
(it manages its own): the connection and the file's path."""

MAX_BATCH = 64
"""Most operations one group transaction runs: bounds how long the first caller of a
batch waits for the last one's work (about 2 ms of statements)."""
DIRECT_WRITE_SPACING = 0.0005
"""Seconds after a direct commit during which this process leaves the file's write lock
alone (a write then goes to the thread, which waits out the rest): a process writing back
to back directly would leave other processes' writers, polling in SQLite's busy handler,
no gap to take the file in."""

_STOP = object()
"""Queued after the last call: the thread closes the connection and ends."""
_CHECKPOINT = object()
"""Queued after many direct writes: the thread checkpoints the WAL between batches."""

_WRITE_LOCKS: dict[str, threading.Lock] = {}
_WRITE_LOCKS_GUARD = threading.Lock()


def write_lock_for(path: str) -> threading.Lock:
    """The one in-process write lock of a database file (by its real path), shared by
    every store of this process that writes to it."""
    key = os.path.realpath(path)
    with _WRITE_LOCKS_GUARD:
        lock = _WRITE_LOCKS.get(key)
        if lock is None:
            lock = _WRITE_LOCKS[key] = threading.Lock()
        return lock


def rollback(conn: sqlite3.Connection, cause: BaseException) -> None:
    """Roll back ``conn``'s transaction, if SQLite has not already; a failure to do so is
    added to ``cause`` as a note (the original error is the one to report)."""
    if not conn.in_transaction:  # SQLite may already have rolled back on its own
        return
    try:
        conn.rollback()
    except sqlite3.Error as exc:
        cause.add_note(f"rolling back the SQLite transaction failed too: {exc}")


class Pending:
    """How many operations of one handle are submitted and not finished (queued, running
    on the thread, or running directly); guarded by the engine's lock, which the worker
    holds as ``pending_guard``."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class Call:
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
        pending: Pending,
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

    def __init__(self, call: Call, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.call, self.cause = call, cause


def _settle(calls: list[Call]) -> None:
    """On the callers' event loop: hand each caller its outcome (unless it gave up)."""
    for call in calls:
        if call.future.done():  # cancelled meanwhile
            continue
        if call.error is not None:
            call.future.set_exception(call.error)
        else:
            call.future.set_result(call.value)


class Worker:
    """The thread that owns one file's connection (with one set of settings) and runs the
    operations queued for it in batches (module docstring).

    ``pending_guard`` is the engine's lock over each handle's :class:`Pending` count: the
    worker takes it to count a call in on :meth:`submit` and out once its batch has run.
    """

    def __init__(
        self,
        path: str,
        busy_timeout: timedelta,
        synchronous: Synchronous,
        *,
        pending_guard: threading.Lock,
    ) -> None:
        self.path = path
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        self.pending_guard = pending_guard
        self.transactions = 0
        """Write transactions begun on the file, on this thread or directly."""
        self.direct_done_at = float("-inf")
        """When the last direct write committed (set by the direct runs): the thread
        leaves the write lock alone for :data:`DIRECT_WRITE_SPACING` after it."""
        self.ready: set[Setup] = set()
        """Setups run on the connection (written on the thread only)."""
        self._conn: sqlite3.Connection | None = None
        # C-implemented: put() is cheap and wakes the thread blocked in get().
        self._queue: queue.SimpleQueue[Call | object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._write_lock: threading.Lock | None = None

    @property
    def opened(self) -> bool:
        """Whether the thread has opened (and migrated) the file."""
        return self._conn is not None

    @property
    def queued(self) -> int:
        """Operations waiting for the thread (for tests)."""
        return self._queue.qsize()

    def write_lock(self) -> threading.Lock:
        """The file's in-process write lock (looked up once: realpath costs a few system
        calls)."""
        if self._write_lock is None:
            self._write_lock = write_lock_for(self.path)
        return self._write_lock

    def error(self, exc: BaseException) -> BaseException:
        """What the caller gets for ``exc`` (see
        :func:`~tiermem.store.backends.sqlite._mapping.caller_error`)."""
        return caller_error(exc, path=self.path, busy_timeout=self.busy_timeout)

    def submit(self, call: Call) -> None:
        """Queue ``call``; the thread starts on the first one."""
        with self.pending_guard:
            call.pending.count += 1
        self._queue.put(call)
        if self._thread is None:
            self._start()

    def request_checkpoint(self) -> None:
        """Have the thread checkpoint the WAL after the batch it is on."""
        self._queue.put(_CHECKPOINT)

    async def aclose(self) -> None:
        """Close the connection after every operation already queued has run."""
        self._queue.put(_STOP)
        if self._thread is None:
            self._start()
        await asyncio.wrap_future(self._closed)

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                # A daemon: a process that exits without closing its stores must not hang
                # on an idle thread. A write cut off at exit is one no caller saw committed.
                self._thread = threading.Thread(
                    target=self._serve, name="tiermem-sqlite", daemon=True
                )
                self._thread.start()

    # -- on the thread ----------------------------------------------------------------------

    def _serve(self) -> None:
        """Take what is queued, a batch at a time, until the stop mark."""
        take = self._queue.get
        empty = self._queue.empty
        stopping = False
        while not stopping:
            batch: list[Call] = []
            item = take()
            checkpoint = False
            while True:
                if item is _STOP:
                    stopping = True
                    break
                if item is _CHECKPOINT:
                    checkpoint = True
                else:
                    batch.append(cast(Call, item))
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
        lock = self.write_lock()
        if not lock.acquire(timeout=self.busy_timeout.total_seconds()):
            return  # the next one catches up
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(f"PRAGMA user_version = {int(version)}")  # the same: page 1 only
            conn.execute("COMMIT")
        except sqlite3.Error as exc:  # the next one, or SQLite's own, catches up
            rollback(conn, exc)
            logger.warning("checkpointing SQLite file %s failed: %s", self.path, exc)
        finally:
            lock.release()

    def _run(self, batch: list[Call]) -> None:
        try:
            self._run_batch(batch)
        except BaseException as exc:  # noqa: BLE001 -- a bug here must not strand callers
            for call in batch:
                if not call.settled:
                    call.fail(exc)
        finally:
            with self.pending_guard:  # before the callers hear, so their next call may go direct
                for call in batch:
                    call.pending.count -= 1
            self._deliver(batch)

    def _run_batch(self, batch: list[Call]) -> None:
        # Reading another thread's future state is a benign race: at worst a call
        # cancelled just now still runs, as one cancelled mid-run does.
        calls = [call for call in batch if not call.future.cancelled()]
        if not calls:
            return
        try:
            conn = self._connection()
        except BaseException as exc:  # noqa: BLE001 -- every caller gets it
            for call in calls:
                call.fail(self.error(exc))
            return
        if any(call.setup is not None and call.setup not in self.ready for call in calls):
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

    def _set_up(self, conn: sqlite3.Connection, calls: list[Call]) -> list[Call]:
        """Run the setups the batch's stores still need; fail the calls of a store whose
        setup failed (it runs again before that store's next operation)."""
        failed: dict[Setup, BaseException] = {}
        for call in calls:
            setup = call.setup
            if setup is None or setup in self.ready or setup in failed:
                continue
            try:
                setup(conn, self.path)
            except BaseException as exc:  # noqa: BLE001 -- that store's callers get it
                rollback(conn, exc)
                failed[setup] = self.error(exc)
            else:
                self.ready.add(setup)
        if not failed:
            return calls
        kept: list[Call] = []
        for call in calls:
            error = failed.get(call.setup) if call.setup is not None else None
            if error is None:
                kept.append(call)
            else:
                call.fail(error)
        return kept

    def _run_reads(self, conn: sqlite3.Connection, calls: list[Call]) -> None:
        """Every read in one read transaction: one snapshot, no write lock."""
        for call in calls:
            try:
                if not conn.in_transaction:
                    conn.execute("BEGIN")
                call.succeed(call.operation(conn))
            except BaseException as exc:  # noqa: BLE001 -- the caller gets it
                call.fail(self.error(exc))
        if conn.in_transaction:
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:  # the reads are done; only the snapshot is left
                rollback(conn, exc)

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
        lock = self.write_lock()
        rest = self.direct_done_at + DIRECT_WRITE_SPACING - time.monotonic()
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

    def _run_alone(self, conn: sqlite3.Connection, call: Call) -> None:
        """One write in its own transaction."""
        try:
            lock = self._begin_write(conn)
            try:
                value = call.operation(conn)
                conn.execute("COMMIT")
            except BaseException as exc:
                rollback(conn, exc)
                raise
            finally:
                lock.release()
        except BaseException as exc:  # noqa: BLE001 -- the caller gets it
            call.fail(self.error(exc))
        else:
            call.succeed(value)

    def _run_group(self, conn: sqlite3.Connection, calls: list[Call]) -> None:
        """Many writes in one transaction, each in its own savepoint."""
        try:
            lock = self._begin_write(conn)
        except BaseException as exc:  # noqa: BLE001 -- every caller gets it
            for call in calls:
                call.fail(self.error(exc))
            return
        done: list[tuple[Call, object]] = []
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
                    call.fail(self.error(exc))
                else:
                    conn.execute("RELEASE tiermem_call")
                    done.append((call, value))
            conn.execute("COMMIT")
        except BaseException as exc:  # noqa: BLE001 -- settled below, call by call
            rollback(conn, exc)
            lost = exc
        finally:
            lock.release()
        if lost is not None:
            # Nothing of the batch is written. The operation that lost the transaction
            # keeps its error; every other write not yet failed runs again on its own.
            if isinstance(lost, _TransactionLostError):
                lost.call.fail(self.error(lost.cause))
            for call in calls:
                if not call.settled:
                    self._run_alone(conn, call)
            return
        for call, value in done:
            call.succeed(value)

    @staticmethod
    def _deliver(calls: list[Call]) -> None:
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

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = open_worker_connection(self.path, self.busy_timeout, self.synchronous)
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
