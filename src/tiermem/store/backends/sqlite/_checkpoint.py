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
(:meth:`Checkpointer.wrote`: one addition per commit; counts from two threads may race,
which only blurs when the next look comes). Every :data:`LOOK_EVERY` writes, the WAL's
length is read from its index (the ``-shm`` file: SQLite's documented WAL-index header,
one ``pread`` of 4 bytes), and from :data:`CHECKPOINT_FRAMES` frames on (SQLite's own
threshold) the thread is woken. So a few large turns wake it as soon as many small ones
would. Should the index not be readable (another layout, a VFS without one), every
:data:`CHECKPOINT_EVERY` writes wake it instead.

**Starting the WAL over.** A ``PASSIVE`` checkpoint copies the frames committed when it
began. SQLite starts the WAL over (writes again from its beginning) only at a write that
finds every frame copied, which a steady stream of writes may never give it: there is
always a newer frame. So after copying, the thread catches up with what was written
meanwhile (at most :data:`CATCH_UP_PASSES` more passes, each shorter than the last, until
one copies at most :data:`CATCH_UP_FRAMES` new frames). Caught up, it takes the file's
in-process write lock for two statements: a ``PASSIVE`` checkpoint of the last few frames
and a one-page write (the file's ``application_id``, unchanged), which starts the WAL over,
syncs its header here rather than in some caller's event loop, and truncates the WAL file
to :data:`~tiermem.store.backends.sqlite._open.WAL_SIZE_LIMIT` bytes should a burst have
grown it. Writers wait only for those two statements. Not caught up after those passes
(writes outpacing the copying), it leaves the WAL to the next checkpoint, unless the WAL
is over :data:`FORCE_FRAMES`: then it starts it over all the same, and the writers wait
for the copying of what is left. A
write that finds every frame copied before the thread's one-page write starts the WAL over
itself (SQLite's rule), syncing the header in its own thread: that happens when the thread
cannot take the lock (another process writing, or a long write of this one). When the WAL
cannot start over (another connection reading an old snapshot), the next checkpoint tries
again.

A failed checkpoint is logged (the first of a run of failures as a warning, the rest at
debug level until one succeeds; :attr:`Checkpointer.failures` counts them) and left to the
next one: no write depends on it. The thread starts with the first checkpoint and ends
when its worker closes (:meth:`Checkpointer.close`), before the worker's own connection,
which, as the file's last connection of this process, checkpoints what is left and
removes the WAL.
"""

from __future__ import annotations

import logging
import os
import queue
import sqlite3
import sys
import threading
from collections.abc import Callable

from tiermem.store.backends.sqlite._mapping import Synchronous, is_busy
from tiermem.store.backends.sqlite._open import open_checkpoint_connection

__all__ = [
    "CATCH_UP_FRAMES",
    "CATCH_UP_PASSES",
    "CHECKPOINT_EVERY",
    "CHECKPOINT_FRAMES",
    "FORCE_FRAMES",
    "LOOK_EVERY",
    "Checkpointer",
]

logger = logging.getLogger(__name__)

CHECKPOINT_FRAMES = 1000
"""WAL frames (pages) from which the thread is woken: SQLite's own automatic threshold."""
LOOK_EVERY = 16
"""Committed writes between two looks at the WAL's length (one ``pread`` each)."""
CHECKPOINT_EVERY = 256
"""Committed writes between two checkpoints when the WAL's length cannot be read: about
1,000 frames for turns appended one by one."""
CATCH_UP_PASSES = 5
"""Unlocked passes at most after the first, copying what was written meanwhile. Each
copies what came during the last, so each is shorter while the copying outpaces the
writes: from 1,000 frames (35-40 ms) with 50 sessions writing at full speed, about 350,
120, 40, then under 32 frames."""
CATCH_UP_FRAMES = 32
"""A pass that copied at most this many new frames is caught up: the rest (written during
it) is copied under the write lock, which is then held for a few frames' copying only."""
FORCE_FRAMES = 4 * CHECKPOINT_FRAMES
"""A WAL this long starts over even when the passes did not catch up (writers then wait
for the copying of what is left): the bound on its length while writes outpace the
copying."""
RESTART_LOCK_WAIT = 1.0
"""Seconds the thread waits for the write lock to start the WAL over, before leaving it
to the next checkpoint (the lock is held for a write's statements and ``COMMIT`` only)."""

_MX_FRAME_OFFSET = 16
"""Where the WAL-index header (at the start of the ``-shm`` file) keeps ``mxFrame``, the
number of valid frames in the WAL: a 32-bit integer in the machine's byte order
(https://www.sqlite.org/walformat.html, "The WAL-Index Header")."""

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
        self._since_look = 0
        self._blind_writes = 0
        self._shm_fd: int | None = None
        self._shm_unreadable = False
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False
        self.checkpoints = 0
        """Checkpoints run (for tests and benches)."""
        self.restarts = 0
        """Times the thread started the WAL over."""
        self.failures = 0
        """Checkpoints that failed (each logged: module docstring)."""
        self._failing = False

    def wrote(self, writes: int) -> None:
        """Count ``writes`` committed writes; every :data:`LOOK_EVERY` of them, wake the
        thread if the WAL is :data:`CHECKPOINT_FRAMES` long. Called after each commit, on
        any thread (races only blur when the next look comes)."""
        self._since_look += writes
        if self._since_look < LOOK_EVERY:
            return
        self._since_look = 0
        frames = self._wal_frames()
        if frames is None:  # the WAL's length is unknown: count writes instead
            self._blind_writes += LOOK_EVERY
            if self._blind_writes >= CHECKPOINT_EVERY:
                self._blind_writes = 0
                self.request()
        elif frames >= CHECKPOINT_FRAMES:
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

    def close(self) -> None:
        """Stop the thread after the checkpoint under way, and close its connection.
        Blocks until then (called on the worker's thread as it closes)."""
        with self._start_lock:
            self._closed = True
            thread = self._thread
            fd, self._shm_fd = self._shm_fd, None
        if thread is not None:
            self._queue.put(_STOP)
            thread.join()
        if fd is not None:
            os.close(fd)

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

    def _wal_frames(self) -> int | None:
        """The WAL's length in frames, read from the WAL index; None when it cannot be
        read (then never again: the file's connections keep the index while open)."""
        fd = self._shm_fd
        if fd is None:
            if self._shm_unreadable:
                return None
            with self._start_lock:
                if self._shm_fd is None and not self._closed:
                    try:
                        # Where SQLite keeps it: beside the file, symbolic links resolved.
                        self._shm_fd = os.open(os.path.realpath(self.path) + "-shm", os.O_RDONLY)
                    except OSError:
                        self._shm_unreadable = True
                fd = self._shm_fd
            if fd is None:
                return None
        try:
            data = os.pread(fd, 4, _MX_FRAME_OFFSET)
        except OSError:  # closed meanwhile
            return None
        if len(data) < 4:  # not initialised yet: no frames
            return 0
        return int.from_bytes(data, sys.byteorder)

    # -- on the thread ----------------------------------------------------------------------

    def _serve(self) -> None:
        conn: sqlite3.Connection | None = None
        restart_write = ""
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
                        conn, restart_write = _open(self.path, self.synchronous)
                    self._checkpoint(conn, restart_write)
                except Exception as exc:  # noqa: BLE001 -- logged; the next one catches up
                    self._failed(exc)
                else:
                    self._failing = False
                _wake(items)
        finally:
            _wake(items)
            if conn is not None:
                conn.close()

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        level = logging.DEBUG if self._failing else logging.WARNING
        self._failing = True
        logger.log(
            level,
            "checkpointing SQLite file %s failed: %s. Writes go on; the WAL grows until a "
            "checkpoint succeeds: check the disk (space, permissions) and that the file is "
            "still there. Repeats of this until one succeeds are logged at debug level.",
            self.path,
            exc,
            exc_info=not isinstance(exc, sqlite3.Error),  # a bug: its trace
        )

    def _checkpoint(self, conn: sqlite3.Connection, restart_write: str) -> None:
        """Copy the WAL, catch up with what was written meanwhile, then start it over."""
        blocked, frames, copied = _passive(conn)
        self.checkpoints += 1
        if blocked or copied < frames:
            return  # a reader of another connection holds old frames: next time
        caught_up = False
        for _ in range(CATCH_UP_PASSES):
            blocked, now, copied = _passive(conn)
            if blocked or copied < now:
                return
            new, frames = now - frames, now
            if new <= CATCH_UP_FRAMES:  # negative when a writer started the WAL over
                caught_up = True
                break
        if caught_up or frames >= FORCE_FRAMES:
            self._restart(conn, restart_write)

    def _restart(self, conn: sqlite3.Connection, restart_write: str) -> None:
        """Under the write lock: copy the last frames, then a one-page write that starts
        the WAL over and syncs its header. Two statements, each in autocommit."""
        lock = self._write_lock()
        if not lock.acquire(timeout=RESTART_LOCK_WAIT):
            return
        try:
            blocked, frames, copied = _passive(conn)
            if blocked or copied < frames:
                return
            try:
                conn.execute(restart_write)
            except sqlite3.OperationalError as exc:
                if is_busy(exc):  # another process is writing: next time
                    return
                raise
            self.restarts += 1
        finally:
            lock.release()


def _open(path: str, synchronous: Synchronous) -> tuple[sqlite3.Connection, str]:
    """The thread's connection, and its one-page write: the file's ``application_id``
    set to what it is (tiermem never changes it), a write to page 1 that changes nothing."""
    conn = open_checkpoint_connection(path, synchronous)
    try:
        (application_id,) = conn.execute("PRAGMA application_id").fetchone()
    except BaseException:
        conn.close()
        raise
    return conn, f"PRAGMA application_id = {int(application_id)}"


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
