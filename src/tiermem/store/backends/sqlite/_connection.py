"""A store's handle on its SQLite file (:class:`SQLiteDatabase`), the per-process registry
that lets the stores of one file share its worker thread, and the direct runs of small
operations on the caller's thread.

This is where every store operation enters: it either runs directly, here, or is queued
for the file's worker thread (:mod:`~tiermem.store.backends.sqlite._worker`, which owns
the connection and group commit; the WAL is checkpointed beside it by
:mod:`~tiermem.store.backends.sqlite._checkpoint`). The connections are opened in
:mod:`~tiermem.store.backends.sqlite._open`. The value, error and settings mapping is in
:mod:`~tiermem.store.backends.sqlite._mapping`; its names are re-exported here for the
modules that import them with the handle.

**Sharing a file.** Each store holds a :class:`SQLiteDatabase`, a handle on its file's
engine: one worker thread with one connection, which it opens on first use (pragmas, then
migrations), plus the connection for direct runs. The stores of one process on the same
file with the same settings (the durable store, the recall index, a SQLite hot store)
share the engine: their operations queue in one line and commit together, so an archive
append and the recall index's write of earlier turns can share one transaction instead of
taking turns at the file's write lock. A store may bring a setup (the recall index's
migrations), run on the connection before that store's first operation. Stores with other
settings (``synchronous``, ``busy_timeout``) and other processes have connections of their
own and are serialized by SQLite: WAL lets readers run beside the one writer, and writes
start with ``BEGIN IMMEDIATE`` so a read-modify-write never loses an update. Connections
of one process also queue on one lock per file, so that they hand the file over at once
instead of polling in SQLite's busy handler.

**Direct runs.** A thread hand-off costs more than a small operation itself: waking the
thread, switching the GIL and waking the event loop again came to 100–150 µs of CPU per
call, against 30–60 µs for a one-row read or a turn's append with its commit. So an
operation its store marks small (``direct=True``: a bounded number of rows) runs on the
calling thread, on the thread's own connection borrowed while the thread is idle
(:meth:`~tiermem.store.backends.sqlite._worker.Worker.borrow`: one page cache for both),
when its store has nothing queued or running (so it still sees every write of that store
submitted before it) and, for a write, the file's in-process write lock is free. A small
read that finds the thread busy runs on a spare connection of the engine instead; a write
goes to the thread. A store marks a write small only when it comes alone
(:meth:`SQLiteDatabase.alone`: no other session wrote within the last
:data:`TOGETHER_WINDOW`): writes of many sessions arriving together go to the thread,
where they share commits and the event loop keeps serving the others. A direct run never
waits: its busy timeout is 0, and a file locked by another process
(``SQLITE_BUSY``) sends the operation to the thread, which waits as usual. After
:data:`~tiermem.store.backends.sqlite._worker.DIRECT_BURST` back-to-back direct writes (or
after each one for :data:`~tiermem.store.backends.sqlite._worker.CONTENDED_FOR` once a
busy answer showed another process writing) the process leaves the write lock alone for
:data:`~tiermem.store.backends.sqlite._worker.DIRECT_WRITE_SPACING` (the next write goes to
the thread, which waits out the rest), so that another process, waiting for the file in
SQLite's busy handler, which polls every few milliseconds, finds it free: without that
gap, one process writing back to back directly starved the other. The gap is owed only
while another process has the file open (checked with
:func:`~tiermem.store.backends.sqlite._sharing.other_process_attached` at most every
:data:`SHARING_RECHECK`, and taken as yes whenever it cannot be told), or once the file
was found contended. So a process alone on its file, the embedded default, writes every
such write directly: the gap's hand-off to the thread, on every third write of a session
writing turn after turn, cost about 100 µs of CPU per turn on the two threads
(``bench/turns.py``). A direct run never checkpoints either (the file's checkpointer thread
does, beside the writes: :mod:`~tiermem.store.backends.sqlite._checkpoint`), so the
caller's event loop is held only for the statements themselves.
A direct write is still committed before it returns, and returns without yielding to the
event loop, as the in-memory stores' calls do: a yield there cost a turn a second pass of
the loop (about 49k instructions, 6 % of a plain embedded turn, ``bench/turn_callgrind.sh``)
and bought no fairness a server needs, since each request's task yields when it ends, and
a caller writing in a loop that fills the background queue waits for room there. Writes
of sessions arriving together go to the thread, and their callers wait on it as before.
``synchronous=FULL`` never runs directly: its commits wait for the disk.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar, cast

from tiermem.errors import BackendUnavailableError, ValidationError
from tiermem.store.backends.sqlite._mapping import (
    DEFAULT_BUSY_TIMEOUT,
    DEFAULT_SYNCHRONOUS,
    Synchronous,
    check_synchronous,
    from_epoch_us,
    is_busy,
    map_sqlite_error,
    to_epoch_us,
)
from tiermem.store.backends.sqlite._open import open_direct_connection
from tiermem.store.backends.sqlite._sharing import other_process_attached
from tiermem.store.backends.sqlite._worker import (
    CONTENDED_FOR,
    DIRECT_BURST,
    DIRECT_WRITE_SPACING,
    MAX_BATCH,
    Call,
    Operation,
    Pending,
    Setup,
    Worker,
    rollback,
)

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

logger = logging.getLogger(__name__)

TOGETHER_WINDOW = 0.002
"""Seconds within which writes of two different writers (sessions) count as arriving
together: then they go to the thread, where they share commits (module docstring)."""
SHARING_RECHECK = 0.25
"""Seconds for which the answer of :func:`other_process_attached` is reused (reading it
costs some 30 µs): a process that opens the file meanwhile gets its first gaps within
this, far inside its busy timeout."""
SHARING_COST_RATIO = 100.0
"""The recheck waits at least this many times the CPU time the last look cost (up to
:data:`SHARING_RECHECK_MAX`): a lock listing slow to read is read less often."""
SHARING_RECHECK_MAX = 1.0
"""Seconds a recheck waits at most, however slow the look: still far inside the busy
timeout of another process's writer waiting for its first gap."""
_QUEUE = object()
"""A direct run's answer when the operation must go to the thread after all."""

_EngineKey = tuple[str, Synchronous, timedelta]


class _Engine:
    """One file (with one set of settings) as this process's handles share it: the
    worker thread and its connection, and the connection for direct runs (module
    docstring)."""

    def __init__(self, path: str, busy_timeout: timedelta, synchronous: Synchronous) -> None:
        self.path = path
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        self.handles = 0  # guarded by _ENGINES_GUARD
        # Guards each handle's Pending count (here and on the worker) and _reader_busy.
        self._guard = threading.Lock()
        self._worker = Worker(path, busy_timeout, synchronous, pending_guard=self._guard)
        self._reader: sqlite3.Connection | None = None
        """For direct reads while the thread uses its connection."""
        self._direct_closed = False
        self._direct_commits = 0
        """Direct write commits (for tests)."""
        self._burst = 0
        """Direct writes in a row, each within DIRECT_WRITE_SPACING of the last direct
        commit (races between threads only blur it)."""
        self._real_path = os.path.realpath(path)
        """Where SQLite keeps the ``-shm`` file (it resolves symbolic links)."""
        self._shared = True
        """Whether another process had the file open when last looked at."""
        self._shared_until = float("-inf")
        """Until when (``time.monotonic``) ``_shared`` is reused."""
        self._sharing_failed = False
        """Whether looking at ``_shared`` has failed (and been logged) once."""
        self._reader_busy = False
        self._last_writer: str | None = None
        self._last_write_at = float("-inf")
        self._outbox: list[Call] = []
        """Calls of one event loop's current turn, handed to the thread together when it
        ends (:meth:`submit`); guarded by ``_guard``."""
        self._outbox_loop: asyncio.AbstractEventLoop | None = None

    @property
    def transactions(self) -> int:
        """Write transactions begun on the file, on the thread or directly."""
        return self._worker.transactions

    @property
    def queued(self) -> int:
        """Operations waiting for the thread (for tests)."""
        with self._guard:
            return len(self._outbox) + self._worker.queued

    def submit(self, call: Call) -> None:
        """Queue ``call`` for the worker thread, with the other calls its event loop makes
        in the same turn: they reach the thread as one list when the turn ends (one
        wake-up of the thread, one group commit), in the order they were made. Counted in
        its handle's :class:`Pending` at once, so no later direct run of that store
        overtakes it. Called on ``call.loop``'s thread; a call of another loop while one
        loop's turn is being gathered goes to the thread alone."""
        stranded: list[Call] = []
        with self._guard:
            call.pending.count += 1
            if self._outbox_loop is not None and self._outbox_loop.is_closed():
                # Its loop closed before the end of its turn: hand those calls over now.
                stranded, self._outbox, self._outbox_loop = self._outbox, [], None
            first = self._outbox_loop is None
            gathered = first or self._outbox_loop is call.loop
            if gathered:
                self._outbox_loop = call.loop
                self._outbox.append(call)
        if stranded:
            self._worker.enqueue(stranded)
        if not gathered:
            self._worker.enqueue([call])
        elif first:
            call.loop.call_soon(self._flush_outbox)

    def _flush_outbox(self) -> None:
        """Hand the gathered calls to the thread (at the end of their loop's turn)."""
        with self._guard:
            calls, self._outbox, self._outbox_loop = self._outbox, [], None
        if calls:
            self._worker.enqueue(calls)

    def alone(self, writer: str) -> bool:
        """Whether a write of ``writer`` (a session) comes alone: the previous write was
        the same writer's, or came more than :data:`TOGETHER_WINDOW` ago. Races between
        threads only blur the hint."""
        now = time.monotonic()
        alone = writer == self._last_writer or now - self._last_write_at >= TOGETHER_WINDOW
        self._last_writer, self._last_write_at = writer, now
        return alone

    def run_direct(
        self,
        operation: Operation[Any],
        write: bool,
        setup: Setup | None,
        pending: Pending,
        single: bool = False,
    ) -> Any:
        """Run ``operation`` on the calling thread if its store has nothing queued or
        running (so it still sees every write of that store submitted before it) and, for
        a write, no one holds the file's write lock; return :data:`_QUEUE` when it must go
        to the thread instead. ``single``: a read of one statement (see
        :meth:`SQLiteDatabase.read`).

        Raises:
            Whatever the operation raises; sqlite3 errors mapped.
        """
        worker = self._worker
        if self.synchronous != "NORMAL" or not worker.opened or self._direct_closed:
            return _QUEUE  # FULL fsyncs each commit; the thread opens and migrates the file
        if setup is not None and setup not in worker.ready:
            return _QUEUE
        back_to_back = False
        if write:
            now = time.monotonic()
            back_to_back = now - worker.direct_done_at < DIRECT_WRITE_SPACING
            if back_to_back and (
                now < worker.contended_until
                or (self._burst >= DIRECT_BURST and self._shared_with_others(now))
            ):
                return _QUEUE  # leave other processes their gap (module docstring)
        with self._guard:
            if pending.count:
                return _QUEUE
            pending.count = 1
        try:
            conn = worker.borrow()  # one caller at a time: the others queue
            if conn is not None:
                try:
                    if not write:
                        return self._direct_read(conn, operation, single)
                    value = self._direct_write(conn, operation)
                    if value is not _QUEUE:
                        self._burst = self._burst + 1 if back_to_back else 1
                    return value
                finally:
                    worker.conn_lock.release()
            if write:
                return _QUEUE
            return self._spare_read(operation, single)
        except BaseException as exc:
            error = worker.error(exc)
            if error is exc:
                raise
            raise error from exc
        finally:
            with self._guard:
                pending.count -= 1

    def _shared_with_others(self, now: float) -> bool:
        """Whether another process may have the file open (module docstring); races
        between threads only read it twice. Looked at again after
        :data:`SHARING_RECHECK`, or after :data:`SHARING_COST_RATIO` times what looking
        cost if that is longer (a host with very many locks), so that looking takes at
        most about 1 % of the time; a failure to look is "shared", logged once."""
        if now >= self._shared_until:
            started = time.thread_time()
            try:
                self._shared = other_process_attached(self._real_path)
            except Exception:  # a write must not fail for a hint: gaps, as when unknown
                self._shared = True
                if not self._sharing_failed:
                    self._sharing_failed = True
                    logger.warning(
                        "cannot tell whether other processes have %s open; leaving them "
                        "gaps between direct writes",
                        self.path,
                        exc_info=True,
                    )
            cost = time.thread_time() - started
            wait = min(SHARING_RECHECK_MAX, max(SHARING_RECHECK, cost * SHARING_COST_RATIO))
            self._shared_until = time.monotonic() + wait
        return self._shared

    def _spare_read(self, operation: Operation[Any], single: bool) -> Any:
        """A direct read while the thread uses its connection: on the spare connection,
        one caller at a time."""
        with self._guard:
            if self._reader_busy or self._direct_closed:
                return _QUEUE
            self._reader_busy = True
        try:
            if self._reader is None:
                self._reader = open_direct_connection(self.path, self.synchronous)
            return self._direct_read(self._reader, operation, single)
        finally:
            with self._guard:
                self._reader_busy = False

    def _direct_read(
        self, conn: sqlite3.Connection, operation: Operation[Any], single: bool
    ) -> Any:
        try:
            if single:  # one statement reads one snapshot on its own (autocommit)
                return operation(conn)
            conn.execute("BEGIN")
            value = operation(conn)
            conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            rollback(conn, exc)
            if is_busy(exc):  # rare in WAL (a recovery): the thread waits it out
                return _QUEUE
            raise
        except BaseException as exc:
            rollback(conn, exc)
            raise
        return value

    def _direct_write(self, conn: sqlite3.Connection, operation: Operation[Any]) -> Any:
        worker = self._worker
        lock = worker.write_lock()
        if not lock.acquire(blocking=False):  # another connection of ours is writing
            return _QUEUE
        try:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if is_busy(exc):  # another process is writing: the thread waits for it
                    worker.contended_until = time.monotonic() + CONTENDED_FOR
                    return _QUEUE
                raise
            worker.transactions += 1
            try:
                value = operation(conn)
                conn.execute("COMMIT")
            except BaseException as exc:
                rollback(conn, exc)
                raise
        finally:
            lock.release()
        worker.direct_done_at = time.monotonic()
        self._direct_commits += 1
        worker.checkpointer.wrote(1)
        return value

    def _direct_connection(self) -> sqlite3.Connection:
        """The connection direct writes run on: the thread's (for tests that trace its
        statements; the thread has opened it)."""
        conn = self._worker.borrow()
        if conn is None:
            raise RuntimeError("the SQLite worker's connection is not open, or in use")
        self._worker.conn_lock.release()
        return conn

    async def aclose(self) -> None:
        """Close the connections after every operation already queued has run."""
        self._flush_outbox()  # ahead of the thread's stop mark
        with self._guard:
            self._direct_closed = True
            reader = None if self._reader_busy else self._reader
            self._reader = None
        if reader is not None:  # no direct run is under way: the last handle is closing
            reader.close()
        await self._worker.aclose()


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
    worker thread, writes commit in groups, small ones may run directly (module
    docstring).

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
        self._pending = Pending()
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

    async def read(
        self, operation: Operation[T], *, direct: bool = False, single: bool = False
    ) -> T:
        """Run ``operation`` in a read transaction (one consistent snapshot).

        ``direct``: the operation is small (a bounded number of rows), so it may run on
        the calling thread when the file is idle (module docstring). ``single``: it runs
        one statement, which reads one snapshot by itself, so a direct run spares the
        ``BEGIN`` and ``COMMIT`` around it (the statement's cursor must be read to its end
        or dropped, as ``conn.execute(...).fetchone()`` does, so that no read stays open)."""
        return cast(T, await self._submit(operation, write=False, direct=direct, single=single))

    async def write(self, operation: Operation[T], *, direct: bool = False) -> T:
        """Run ``operation`` in a write transaction, committed before this returns; if it
        raises, its changes are rolled back and no one else's are.

        ``direct``: the operation is small, so it may run on the calling thread when the
        file is idle and writes are sparse (module docstring)."""
        return cast(T, await self._submit(operation, write=True, direct=direct, single=False))

    async def aclose(self) -> None:
        """Let go of the file; the last handle closes the connection after the operations
        already submitted have run."""
        if self._closed:
            return
        self._closed = True
        if _detach(self._engine):
            await self._engine.aclose()

    async def _submit(
        self, operation: Operation[Any], *, write: bool, direct: bool, single: bool
    ) -> Any:
        if self._closed:
            raise BackendUnavailableError(
                f"the SQLite store on {self.path} has been closed; open a new one",
                backend="sqlite",
                retryable=False,
            )
        if direct:
            value = self._engine.run_direct(operation, write, self._setup, self._pending, single)
            if value is not _QUEUE:
                return value
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._engine.submit(Call(operation, write, self._setup, self._pending, loop, future))
        return await future
