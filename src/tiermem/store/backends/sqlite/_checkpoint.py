"""The checkpointer of one SQLite file: a thread of its own that copies the WAL into the
database beside the writes, instead of inside one of them.

**Why a thread of its own.** A checkpoint writes every page the WAL holds into the
database file and syncs it: on the development machine, 35-40 ms for SQLite's default
1,000 pages (about 40 µs a page). SQLite's automatic checkpoint runs it inside the commit
that crosses the threshold, so every write queued behind that commit waited for it. With
50 sessions writing at once (``bench/turns.py``) that was one stall of ~20 ms every ~500
turns, which every session met about every tenth turn: the p99 of ``add_turn`` was
28-35 ms, against 17 ms with no checkpoint at all. Here the writers never checkpoint
(every connection of the file has ``wal_autocheckpoint = 0``); this thread does, on a
connection of its own, while they go on writing: WAL lets one checkpoint run beside one
writer and any number of readers.

**When.** Every committed write (a direct one, or one of a group commit's) is counted
(:meth:`Checkpointer.wrote`); every :data:`CHECKPOINT_EVERY` of them wake the thread. The
count is a proxy for WAL pages (a turn's append writes three to four, fewer per write in a
group, where writes share pages) that costs one addition per commit; counts from two
threads may race, which only blurs when the next checkpoint comes.

**Starting the WAL over.** A ``PASSIVE`` checkpoint copies the frames committed when it
began. SQLite starts the WAL over (writes again from its beginning) only at a write that
finds every frame copied, which a steady stream of writes may never give it: there is
always a newer frame. So after copying, the thread catches up with what was written
meanwhile (at most :data:`CATCH_UP_PASSES` more passes, each shorter than the last, until
one copies at most :data:`CATCH_UP_FRAMES`), then takes the file's write lock, copies the
last few frames and makes a one-page write, which starts the WAL over and syncs its
header, here rather than in some caller's event loop. Writers wait only for that last
step (a few frames: about a millisecond), and the WAL stays within a few thousand frames.
Should it not start over (another process reading an old snapshot, or holding the write
lock), the next checkpoint tries again.

A failed checkpoint is logged and left to the next one: no write depends on it. The
thread starts with the first checkpoint and ends when its worker closes
(:meth:`Checkpointer.close`), before the worker's own connection, which, as the file's last
connection of this process, checkpoints what is left.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from collections.abc import Callable

from tiermem.store.backends.sqlite._mapping import Synchronous, is_busy
from tiermem.store.backends.sqlite._open import open_direct_connection

__all__ = ["CATCH_UP_FRAMES", "CATCH_UP_PASSES", "CHECKPOINT_EVERY", "Checkpointer"]

logger = logging.getLogger(__name__)

CHECKPOINT_EVERY = 256
"""Committed writes between two checkpoints: about 1,000 WAL pages for turns appended one
by one (SQLite's own default threshold), fewer when group commits share pages."""
CATCH_UP_PASSES = 3
"""Unlocked passes at most after the first, copying what was written meanwhile, before the
thread takes the write lock to start the WAL over."""
CATCH_UP_FRAMES = 32
"""A pass that copied at most this many new frames is caught up: the rest (written during
it) is copied under the write lock."""

RESTART_LOCK_WAIT = 1.0
"""Seconds the thread waits for the write lock to start the WAL over, before leaving it
to the next checkpoint (the lock is held for a write's statements and ``COMMIT`` only)."""

_STOP = object()


class Checkpointer:
    """Checkpoints one file's WAL on a thread of its own (module docstring).

    ``write_lock`` returns the file's in-process write lock, taken for the last step of
    starting the WAL over.
    """

    def __init__(
        self, path: str, synchronous: Synchronous, write_lock: Callable[[], threading.Lock]
    ) -> None:
        self.path = path
        self.synchronous = synchronous
        self._write_lock = write_lock
        self._writes = 0
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False
        self.checkpoints = 0
        """Checkpoints run (for tests and benches)."""
        self.restarts = 0
        """Times the thread started the WAL over."""

    def wrote(self, writes: int) -> None:
        """Count ``writes`` committed writes; every :data:`CHECKPOINT_EVERY` wake the
        thread. Called after each commit, on any thread (races only blur the count)."""
        self._writes += writes
        if self._writes >= CHECKPOINT_EVERY:
            self._writes = 0
            self.request()

    def request(self) -> None:
        """Have the thread checkpoint now (requests made while it works collapse into
        one more checkpoint)."""
        self._put(None)

    def run_now(self) -> threading.Event:
        """Have the thread checkpoint now; the event is set once it has (or has stopped):
        for tests and benches, which wait on it off their event loop."""
        done = threading.Event()
        self._put(done)
        if self._closed:
            done.set()
        return done

    def _put(self, item: object) -> None:
        if self._closed:
            return
        self._queue.put(item)
        if self._thread is None:
            with self._start_lock:
                if self._thread is None and not self._closed:
                    # A daemon, as the worker: a process exiting without closing its
                    # stores must not hang on it (a checkpoint cut off loses nothing).
                    self._thread = threading.Thread(
                        target=self._serve, name="tiermem-sqlite-checkpoint", daemon=True
                    )
                    self._thread.start()

    def close(self) -> None:
        """Stop the thread after the checkpoint under way, and close its connection.
        Blocks until then (called on the worker's thread as it closes)."""
        with self._start_lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(_STOP)
            thread.join()

    # -- on the thread ----------------------------------------------------------------------

    def _serve(self) -> None:
        conn: sqlite3.Connection | None = None
        items: list[object] = []
        try:
            while True:
                items = [self._queue.get()]
                while not self._queue.empty():  # requests made meanwhile: one checkpoint
                    items.append(self._queue.get())
                if any(item is _STOP for item in items):
                    return
                try:
                    if conn is None:
                        conn = open_direct_connection(self.path, self.synchronous)
                    self._checkpoint(conn)
                except Exception as exc:
                    logger.warning(
                        "checkpointing SQLite file %s failed: %s",
                        self.path,
                        exc,
                        exc_info=not isinstance(exc, sqlite3.Error),  # a bug: its trace
                    )
                _wake(items)
        finally:
            _wake(items)
            if conn is not None:
                conn.close()

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        """Copy the WAL, catch up with what was written meanwhile, then start it over."""
        blocked, frames, copied = _passive(conn)
        self.checkpoints += 1
        if blocked or copied < frames:
            return  # a reader of another connection holds old frames: next time
        for _ in range(CATCH_UP_PASSES):
            blocked, now, copied = _passive(conn)
            if blocked or copied < now:
                return
            new, frames = now - frames, now
            if new <= CATCH_UP_FRAMES:  # negative when a writer started the WAL over
                break
        self._restart(conn)

    def _restart(self, conn: sqlite3.Connection) -> None:
        """Under the write lock: copy the last frames, then a one-page write (the user
        version, unchanged) that starts the WAL over and syncs its header."""
        lock = self._write_lock()
        # A write of this process may hold it: for its statements and COMMIT only.
        if not lock.acquire(timeout=RESTART_LOCK_WAIT):
            return
        try:
            blocked, frames, copied = _passive(conn)
            if blocked or copied < frames:
                return
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if is_busy(exc):  # another process is writing: next time
                    return
                raise
            try:
                (version,) = conn.execute("PRAGMA user_version").fetchone()
                conn.execute(f"PRAGMA user_version = {int(version)}")  # page 1 only
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.rollback()
                raise
            self.restarts += 1
        finally:
            lock.release()


def _wake(items: list[object]) -> None:
    for item in items:
        if isinstance(item, threading.Event):
            item.set()


def _passive(conn: sqlite3.Connection) -> tuple[bool, int, int]:
    """One ``PASSIVE`` checkpoint: whether it was blocked (another connection
    checkpointing), the WAL's frames and how many of them are now in the database."""
    try:
        blocked, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    except sqlite3.OperationalError as exc:
        if is_busy(exc):
            return True, 0, 0
        raise
    return bool(blocked), int(frames), int(copied)
