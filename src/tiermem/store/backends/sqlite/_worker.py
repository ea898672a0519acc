"""The worker thread of one SQLite file: it opens the file's connection, runs the operations
queued by the file's stores in batches and commits each batch's writes together. The WAL
is checkpointed beside it, on a thread of its own
(:mod:`~tiermem.store.backends.sqlite._checkpoint`).

Everything that runs on that thread lives here, so that a write's path from the queue to
its ``COMMIT`` and to its caller's event loop reads in one place. The store-facing handle,
the direct runs on the caller's thread and the per-process registry of workers are in
:mod:`~tiermem.store.backends.sqlite._connection`.

**Opening.** The thread opens the connection on its first batch
(:func:`~tiermem.store.backends.sqlite._open.open_worker_connection`: busy timeout, WAL,
``synchronous``, the store's migrations). A store may also bring a setup (the recall
index's migrations), run on the connection before that store's first operation.

**One connection, lent out.** Direct runs on callers' threads borrow the same connection
while the thread is idle (:meth:`Worker.borrow`): whoever uses it holds
:attr:`Worker.conn_lock`. One connection keeps one page cache: SQLite drops a
connection's whole cache when another connection has written since its last transaction,
so direct appends on a second connection, between the thread's index writes, re-read
every page they touched (about 70 µs of CPU per append). A borrower switches the
connection to not waiting (busy timeout 0: the caller's event loop is held only for its
statements); the thread switches it back before its next batch; each switch is one
``PRAGMA`` statement, and only when the user changes. No connection of the file
checkpoints on its own (``wal_autocheckpoint = 0``).

**Group commit.** Operations queue up while the thread works; it then takes everything
queued (at most about :data:`MAX_BATCH`) at once. Calls made during one turn of an event
loop arrive as one list (:meth:`Worker.enqueue`, fed by the engine's outbox in
:mod:`~tiermem.store.backends.sqlite._connection`): one wake-up of the thread for them all,
and one batch, where calls handed over one by one each woke the thread, which took them
one at a time. Its writes share one ``BEGIN IMMEDIATE … COMMIT``. An operation that raises
rolls back only its own changes and fails only its own caller: the writes first run
without savepoints (two statements each, and every statement on this thread hands the GIL
to the event loop and waits to get it back), and should one raise, the transaction is
rolled back and the batch runs again with each write inside its own ``SAVEPOINT`` (so a
raise costs the batch a second run: writes rarely raise). Every caller of the batch learns
its outcome after the ``COMMIT``, so no write is acknowledged before it is committed.
Should the transaction itself fail (the ``COMMIT``, or an error after which SQLite rolled
the whole transaction back), nothing of the batch was written, and each of its other
writes runs again alone, in its own transaction: one operation can never make another
fail. A lone write runs without a savepoint. The batch's reads need no write lock (WAL):
those queued before its first write share one read transaction ahead of the writes, those
queued after one share another after the commit, so a read always sees every write queued
before it.
Outcomes reach each event loop in one wake-up per batch, not one per call: with many
sessions writing at once, the commit, the thread hand-off and the wake-up are shared.

A caller that is cancelled while its operation runs does not undo it: the operation
commits or rolls back with its batch, whatever the caller sees. One cancelled before its
batch starts is skipped.

**The write lock.** Every write of this process on a file, on any connection, first takes
the file's in-process write lock (:func:`write_lock_for`), then ``BEGIN IMMEDIATE``, so a
read-modify-write never loses an update and connections of one process hand the file over
at once instead of polling in SQLite's busy handler. The thread waits out
:data:`DIRECT_WRITE_SPACING` after a direct commit before taking the lock, so that other
processes find the file free (direct writes send a write to the thread for that gap: see
:data:`DIRECT_BURST`).

**Checkpoints.** Every commit, here or direct, is counted by the file's
:class:`~tiermem.store.backends.sqlite._checkpoint.Checkpointer`, whose thread copies the
WAL into the database beside the writes and starts it over: neither a batch nor a direct
write waits for the disk's checkpoint (see that module for why and how).
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
from tiermem.store.backends.sqlite._checkpoint import Checkpointer
from tiermem.store.backends.sqlite._mapping import Synchronous, caller_error
from tiermem.store.backends.sqlite._open import open_worker_connection

__all__ = [
    "CONTENDED_FOR",
    "DIRECT_BURST",
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
"""Operations after which the thread stops taking more into one group transaction (a list
handed over at once is taken whole): bounds how long the first caller of a batch waits
for the last one's work (about 2 ms of statements)."""
DIRECT_WRITE_SPACING = 0.0005
"""Seconds after a direct commit during which this process may leave the file's write
lock alone (a write then goes to the thread, which waits out the rest): a process writing
back to back directly would leave other processes' writers, polling in SQLite's busy
handler, no gap to take the file in. A writer waiting in another process never shows here
(it holds nothing until it gets in), so the gap is left after every :data:`DIRECT_BURST`
back-to-back direct writes, and after every one while the file is known to be contended
(:data:`CONTENDED_FOR`)."""
DIRECT_BURST = 2
"""Back-to-back direct writes (each within :data:`DIRECT_WRITE_SPACING` of the last direct
commit) after which the next goes to the thread for the gap, while another process has
the file open (none is owed to no one: see
:mod:`~tiermem.store.backends.sqlite._connection`). A gap after every one (as
before) cost a thread hand-off (about 100 µs of CPU, and the caller's caches gone cold) on
almost every other write of one session writing turn after turn; 2 cut those hand-offs by
about a third. 4 cut nearly all of them, but then two processes writing one session in a
tight loop (tests/reliability/test_concurrency.py) sometimes ran one after the other: the
waiting one's busy handler, polling every few milliseconds, found the file taken every
time."""
CONTENDED_FOR = 10.0
"""Seconds after another process was last found holding the file's write lock (a direct
``BEGIN IMMEDIATE`` answered busy) during which every back-to-back direct write leaves the
gap. Twice the default busy timeout: a writer of another process that waits in SQLite's
busy handler gets its gaps for longer than it can wait."""

_STOP = object()
"""Queued after the last call: the thread closes the connection and ends."""

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
        self.contended_until = float("-inf")
        """Until when (``time.monotonic``) the file counts as shared with another
        process's writer (set by the direct runs on a busy answer; :data:`CONTENDED_FOR`)."""
        self.ready: set[Setup] = set()
        """Setups run on the connection (written on the thread only)."""
        self._conn: sqlite3.Connection | None = None
        self.conn_lock = threading.Lock()
        """Held by whoever uses the connection: the thread for a batch, a borrower for a
        direct run (:meth:`borrow`)."""
        self._lent = False
        """Whether the connection is set up for direct runs (busy timeout 0) rather than
        for the thread; guarded by :attr:`conn_lock`."""
        # C-implemented: put() is cheap and wakes the thread blocked in get().
        self._queue: queue.SimpleQueue[Call | list[Call] | object] = queue.SimpleQueue()
        self._waiting = 0
        """Calls queued and not yet taken by the thread (guarded by ``pending_guard``)."""
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._write_lock: threading.Lock | None = None
        self.checkpointer = Checkpointer(path, synchronous, self.write_lock)
        """Checkpoints the WAL on a thread of its own; every commit is counted in it."""

    @property
    def opened(self) -> bool:
        """Whether the thread has opened (and migrated) the file."""
        return self._conn is not None

    @property
    def queued(self) -> int:
        """Operations waiting for the thread (for tests)."""
        return self._waiting

    def borrow(self) -> sqlite3.Connection | None:
        """The connection for a direct run on the calling thread, set up not to wait;
        None when the thread (or another borrower) is using it, or it is
        not open. The borrower gives it back with ``conn_lock.release()``.

        Raises:
            sqlite3.Error: setting it up failed (nothing is borrowed).
        """
        if not self.conn_lock.acquire(blocking=False):
            return None
        conn = self._conn
        if conn is None:
            self.conn_lock.release()
            return None
        if not self._lent:
            try:
                conn.execute("PRAGMA busy_timeout = 0")
            except BaseException:
                self.conn_lock.release()
                raise
            self._lent = True
        return conn

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
        self.enqueue([call])

    def enqueue(self, calls: list[Call]) -> None:
        """Queue ``calls``, already counted in their handles' :class:`Pending`, for one
        batch (lists longer than :data:`MAX_BATCH` in several)."""
        with self.pending_guard:
            self._waiting += len(calls)
        for start in range(0, len(calls), MAX_BATCH):
            self._queue.put(calls[start : start + MAX_BATCH])
        if self._thread is None:
            self._start()

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
            while True:
                if item is _STOP:
                    stopping = True
                    break
                batch.extend(cast(list[Call], item))
                if len(batch) >= MAX_BATCH or empty():
                    break
                item = take()
            if batch:
                with self.pending_guard:
                    self._waiting -= len(batch)
                self._run(batch)
        try:
            self._close()
        except BaseException as exc:  # noqa: BLE001 -- the closer hears of it
            self._closed.set_exception(exc)
        else:
            self._closed.set_result(None)

    def _run(self, batch: list[Call]) -> None:
        try:
            with self.conn_lock:
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
            self._take_back(conn)
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
        now = time.monotonic()
        rest = self.direct_done_at + DIRECT_WRITE_SPACING - now
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
            self.checkpointer.wrote(1)
            call.succeed(value)

    def _run_group(self, conn: sqlite3.Connection, calls: list[Call]) -> None:
        """Many writes in one transaction, at first without savepoints: each costs two
        statements, and every statement on this thread hands the GIL to the event loop and
        waits to get it back. Should one write raise, the transaction is rolled back and
        the batch runs again with a savepoint per write (:meth:`_run_group_guarded`), so
        that write still fails alone. Writes rarely raise (a conflict, a turn too large),
        and running an operation again is safe: it is what a lost transaction does too."""
        try:
            lock = self._begin_write(conn)
        except BaseException as exc:  # noqa: BLE001 -- every caller gets it
            for call in calls:
                call.fail(self.error(exc))
            return
        done: list[tuple[Call, object]] = []
        raised = False
        lost: BaseException | None = None
        try:
            for call in calls:
                try:
                    value = call.operation(conn)
                except BaseException:  # noqa: BLE001 -- run again below, where it fails alone
                    raised = True
                    break
                done.append((call, value))
            if raised:
                if conn.in_transaction:
                    conn.rollback()
            else:
                conn.execute("COMMIT")
        except BaseException as exc:  # noqa: BLE001 -- settled below, call by call
            rollback(conn, exc)
            lost = exc
        finally:
            lock.release()
        if raised and lost is None:
            self._run_group_guarded(conn, calls)
        elif lost is not None:
            # Nothing of the batch is written (the COMMIT failed, or the rollback): each
            # write runs again on its own, so one cannot make another fail.
            for call in calls:
                if not call.settled:
                    self._run_alone(conn, call)
        else:
            self.checkpointer.wrote(len(done))
            for call, value in done:
                call.succeed(value)

    def _run_group_guarded(self, conn: sqlite3.Connection, calls: list[Call]) -> None:
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
        self.checkpointer.wrote(len(done))
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

    def _take_back(self, conn: sqlite3.Connection) -> None:
        """Set the connection up for the thread again after direct runs borrowed it (the
        caller holds :attr:`conn_lock`): it waits for locks as usual."""
        if self._lent:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout.total_seconds() * 1000)}")
            self._lent = False

    def _close(self) -> None:
        # The checkpointer first: the thread's connection, closing last, checkpoints the rest.
        self.checkpointer.close()
        with self.conn_lock:  # after a direct run under way
            if self._conn is not None:
                self._conn.close()
                self._conn = None
