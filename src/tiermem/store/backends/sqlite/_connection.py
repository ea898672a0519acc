"""A store's handle on its SQLite file (:class:`SQLiteDatabase`), the per-process registry
that lets the stores of one file share its worker thread, and the direct runs of small
operations on the caller's thread.

This is where every store operation enters: it either runs directly, here, or is queued
for the file's worker thread (:mod:`~tiermem.store.backends.sqlite._worker`, which owns
the connection, group commit and checkpoints). Both connections are opened in
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
calling thread, on a second connection of the engine, when its store has nothing queued
or running (so it still sees every write of that store submitted before it) and, for a
write, the file's in-process write lock is free. A write is marked small only when it
comes alone (:meth:`SQLiteDatabase.alone`: no other session wrote within the last
:data:`TOGETHER_WINDOW`): writes of many sessions arriving together go to the thread,
where they share commits and the event loop keeps serving the others. After a direct
commit the process leaves the write lock alone for
:data:`~tiermem.store.backends.sqlite._worker.DIRECT_WRITE_SPACING` (a write in that time
goes to the thread, which waits out the rest), so that another process waiting for the
file in SQLite's busy handler, which polls every few milliseconds, finds it free: without
that gap, one process writing back to back directly starved the other. The direct
connection never waits: its busy timeout is 0, and a file locked by another process
(``SQLITE_BUSY``) sends the operation to the thread, which waits as usual; it never
checkpoints either (the thread runs a passive checkpoint every :data:`CHECKPOINT_EVERY`
direct commits), so the caller's event loop is held only for the statements themselves.
A direct write is still committed before it returns, then yields once to the event loop.
``synchronous=FULL`` never runs directly: its commits wait for the disk.
"""

from __future__ import annotations

import asyncio
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
from tiermem.store.backends.sqlite._worker import (
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

TOGETHER_WINDOW = 0.002
"""Seconds within which writes of two different writers (sessions) count as arriving
together: then they go to the thread, where they share commits (module docstring)."""
CHECKPOINT_EVERY = 256
"""Direct write commits between two checkpoints run on the thread (direct commits never
checkpoint: a checkpoint may wait on the disk)."""

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
        # Guards each handle's Pending count (here and on the worker) and _direct_busy.
        self._guard = threading.Lock()
        self._worker = Worker(path, busy_timeout, synchronous, pending_guard=self._guard)
        self._direct: sqlite3.Connection | None = None
        self._direct_closed = False
        self._direct_commits = 0
        self._direct_busy = False
        self._last_writer: str | None = None
        self._last_write_at = float("-inf")

    @property
    def transactions(self) -> int:
        """Write transactions begun on the file, on the thread or directly."""
        return self._worker.transactions

    @property
    def queued(self) -> int:
        """Operations waiting for the thread (for tests)."""
        return self._worker.queued

    def submit(self, call: Call) -> None:
        """Queue ``call`` for the worker thread."""
        self._worker.submit(call)

    def alone(self, writer: str) -> bool:
        """Whether a write of ``writer`` (a session) comes alone: the previous write was
        the same writer's, or came more than :data:`TOGETHER_WINDOW` ago. Races between
        threads only blur the hint."""
        now = time.monotonic()
        alone = writer == self._last_writer or now - self._last_write_at >= TOGETHER_WINDOW
        self._last_writer, self._last_write_at = writer, now
        return alone

    def run_direct(
        self, operation: Operation[Any], write: bool, setup: Setup | None, pending: Pending
    ) -> Any:
        """Run ``operation`` on the calling thread if its store has nothing queued or
        running (so it still sees every write of that store submitted before it) and, for
        a write, no one holds the file's write lock; return :data:`_QUEUE` when it must go
        to the thread instead.

        Raises:
            Whatever the operation raises; sqlite3 errors mapped.
        """
        worker = self._worker
        if self.synchronous != "NORMAL" or not worker.opened or self._direct_closed:
            return _QUEUE  # FULL fsyncs each commit; the thread opens and migrates the file
        if setup is not None and setup not in worker.ready:
            return _QUEUE
        if write and time.monotonic() - worker.direct_done_at < DIRECT_WRITE_SPACING:
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
            error = worker.error(exc)
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
        if self._direct_commits % CHECKPOINT_EVERY == 0:
            worker.request_checkpoint()
        return value

    def _direct_connection(self) -> sqlite3.Connection:
        if self._direct is None:
            # Callers take turns on it through _direct_busy.
            self._direct = open_direct_connection(self.path, self.synchronous)
        return self._direct

    async def aclose(self) -> None:
        """Close the connections after every operation already queued has run."""
        with self._guard:
            direct, self._direct, self._direct_closed = self._direct, None, True
        if direct is not None:  # no direct run is under way: the last handle is closing
            direct.close()
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
        self._engine.submit(Call(operation, write, self._setup, self._pending, loop, future))
        return await future
