"""Where the SQLite backend runs an operation (issue #8): on the caller's thread, on the
worker's own connection borrowed while the worker is idle, or on the worker thread.

* A lone writer's back-to-back writes run directly. While another process has the file
  open, one in every ``DIRECT_BURST + 1`` goes to the thread to leave that process's
  writers a gap; once another writer has been found holding the file, every back-to-back
  write does.
* Direct runs and the worker share one connection (one page cache): a direct write never
  runs while the worker uses it, a direct read then takes the spare connection, and every
  result is the same as if each had run on the thread.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from tiermem.store.backends.sqlite import _connection, _worker
from tiermem.store.backends.sqlite._connection import SQLiteDatabase
from tiermem.store.backends.sqlite._sharing import other_process_attached
from tiermem.store.backends.sqlite._worker import DIRECT_BURST, DIRECT_WRITE_SPACING

needs_proc_locks = pytest.mark.skipif(
    not os.path.exists("/proc/locks"), reason="tells other processes apart by /proc/locks"
)


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[SQLiteDatabase]:
    handle = SQLiteDatabase(tmp_path / "tiermem.db", role="durable")

    def create(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE t (n INTEGER NOT NULL)")

    await handle.write(create)  # the worker opens and migrates the file
    yield handle
    await handle.aclose()


Seen = tuple[int, list[int]]
"""The thread an operation ran on, and the table as it saw it."""


def insert(n: int) -> Callable[[sqlite3.Connection], Seen]:
    """An operation inserting ``n``."""

    def op(conn: sqlite3.Connection) -> Seen:
        conn.execute("INSERT INTO t (n) VALUES (?)", (n,))
        return threading.get_ident(), [row[0] for row in conn.execute("SELECT n FROM t")]

    return op


_HOLD_OPEN = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
print("open", flush=True)
sys.stdin.readline()
"""


@contextmanager
def another_process_on(path: Path) -> Iterator[None]:
    """Another process with the file open (reading, not writing) for the block."""
    child = subprocess.Popen(  # noqa: S603 -- this interpreter, a constant script
        [sys.executable, "-c", _HOLD_OPEN, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "open\n"
        yield
    finally:
        child.communicate("done\n", timeout=10)


@pytest.fixture
def wide_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes 50 ms apart count as back to back (so the test's surely do), and whether
    another process has the file open is looked at on every write."""
    monkeypatch.setattr(_connection, "DIRECT_WRITE_SPACING", 0.05)
    monkeypatch.setattr(_worker, "DIRECT_WRITE_SPACING", 0.05)
    monkeypatch.setattr(_connection, "SHARING_RECHECK", 0.0)
    monkeypatch.setattr(_connection, "SHARING_COST_RATIO", 0.0)


@needs_proc_locks
async def test_a_writer_alone_on_its_file_writes_back_to_back_directly(
    db: SQLiteDatabase, wide_gaps: None
) -> None:
    me = threading.get_ident()
    for n in range(3 * (DIRECT_BURST + 1)):
        ran_on, seen = await db.write(insert(n), direct=db.alone("s-1"))
        assert ran_on == me  # no other process to leave a gap to
        assert seen == list(range(n + 1))


@needs_proc_locks
async def test_while_another_process_has_the_file_open_direct_writes_leave_gaps(
    db: SQLiteDatabase, tmp_path: Path, wide_gaps: None
) -> None:
    me = threading.get_ident()
    with another_process_on(tmp_path / "tiermem.db"):
        threads = []
        for n in range(2 * (DIRECT_BURST + 1)):
            ran_on, seen = await db.write(insert(n), direct=db.alone("s-1"))
            threads.append(ran_on)
            assert seen == list(range(n + 1))  # committed, in order
    # DIRECT_BURST back to back directly, then one to the thread (which waits out the gap).
    assert [ran_on == me for ran_on in threads] == 2 * ([True] * DIRECT_BURST + [False])
    # The other process gone, no gap is owed any more.
    ran_on, _ = await db.write(insert(100), direct=True)
    ran_on_too, _ = await db.write(insert(101), direct=True)
    ran_on_still, _ = await db.write(insert(102), direct=True)
    assert [ran_on, ran_on_too, ran_on_still] == [me] * 3


async def test_a_lone_writer_writes_back_to_back_directly_but_for_the_gaps(
    db: SQLiteDatabase,
) -> None:
    """Wherever it runs (another process may have the file open, or it cannot be told),
    at most one write in DIRECT_BURST + 1 goes to the thread."""
    me = threading.get_ident()
    threads = []
    for n in range(50):  # mostly quicker than DIRECT_WRITE_SPACING apart
        ran_on, seen = await db.write(insert(n), direct=db.alone("s-1"))
        threads.append(ran_on)
        assert seen == list(range(n + 1))  # committed, in order
    handed_over = sum(ran_on != me for ran_on in threads)
    # A gap after every direct commit would have sent every other write to the thread.
    assert handed_over <= 50 // (DIRECT_BURST + 1) + 1
    assert threads[:DIRECT_BURST] == [me] * DIRECT_BURST


@needs_proc_locks
def test_other_processes_on_a_file_are_told_from_this_one(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    conn = sqlite3.connect(path, isolation_level=None)
    with closing(conn):
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE t (n INTEGER)")
        assert not other_process_attached(str(path))
        with another_process_on(path):
            assert other_process_attached(str(path))
        assert not other_process_attached(str(path))
        # When it cannot be told, the answer is "maybe": the gaps are left as before.
        assert other_process_attached(str(path), locks_file=str(tmp_path / "none"))
        empty = tmp_path / "locks"
        empty.write_text("")  # this process's own lock not listed: the listing is no use
        assert other_process_attached(str(path), locks_file=str(empty))
    assert other_process_attached(str(tmp_path / "closed.db"))  # no -shm file


def _shm_device(path: Path) -> str:
    """The ``-shm`` file as the lock listing names it (major:minor:inode)."""
    shm = os.stat(f"{path}-shm")
    return f"{os.major(shm.st_dev):02x}:{os.minor(shm.st_dev):02x}:{shm.st_ino}"


def test_a_lock_listing_is_read_only_so_far_and_only_its_lines_on_the_file_count(
    tmp_path: Path,
) -> None:
    """Listings written to plain files: the same parser as /proc/locks, with entries a
    test cannot make the kernel list (a longer inode that starts like ours, a host with
    thousands of locks)."""
    path = tmp_path / "t.db"
    conn = sqlite3.connect(path, isolation_level=None)
    with closing(conn):
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE t (n INTEGER)")
        device = _shm_device(path)
        mine = f"1: POSIX  ADVISORY  READ {os.getpid()} {device} 128 128\n"
        theirs = f"2: POSIX  ADVISORY  READ {os.getpid() + 1} {device} 128 128\n"
        # The same device with a longer inode number is another file.
        lookalike = f"3: POSIX  ADVISORY  READ {os.getpid() + 1} {device}7 128 128\n"
        listing = tmp_path / "locks"

        def attached(text: str, **kwargs: int) -> bool:
            listing.write_text(text)
            return other_process_attached(str(path), locks_file=str(listing), **kwargs)

        assert not attached(mine)
        assert not attached(lookalike + mine + lookalike.rstrip("\n"))
        assert attached(mine + theirs)
        assert attached(theirs.rstrip("\n") + "\n" + mine)
        assert attached(lookalike)  # our own lock not listed: cannot be told
        # A listing longer than the cap is not read to its end: cannot be told.
        filler = "9: FLOCK  ADVISORY  WRITE 1 00:01:1 0 EOF\n" * 100
        assert not attached(mine + filler, max_bytes=len(mine + filler))
        assert attached(mine + filler, max_bytes=len(mine + filler) - 1)
        # Unreadable: a directory where the listing should be.
        assert other_process_attached(str(path), locks_file=str(tmp_path))


async def test_a_failure_to_tell_who_has_the_file_open_never_fails_a_write(
    db: SQLiteDatabase, wide_gaps: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fake that raises: reading a real listing fails only with OSError, which the
    reader answers itself; this is the engine's guard against anything else."""

    def broken(path: str) -> bool:
        raise RuntimeError("no listing")

    monkeypatch.setattr(_connection, "other_process_attached", broken)
    me = threading.get_ident()
    threads = []
    for n in range(2 * (DIRECT_BURST + 1)):
        ran_on, seen = await db.write(insert(n), direct=db.alone("s-1"))
        threads.append(ran_on)
        assert seen == list(range(n + 1))  # committed, in order
    # Taken as shared: the gaps are left, as when it cannot be told.
    assert [ran_on == me for ran_on in threads] == 2 * ([True] * DIRECT_BURST + [False])


async def test_once_another_writer_holds_the_file_direct_writes_leave_it_gaps(
    db: SQLiteDatabase, tmp_path: Path
) -> None:
    me = threading.get_ident()
    other = sqlite3.connect(tmp_path / "tiermem.db", isolation_level=None, timeout=0)
    with closing(other):
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        pending = asyncio.ensure_future(db.write(insert(0), direct=True))
        await asyncio.sleep(0.05)
        assert not pending.done()  # busy: sent to the worker, which waits for the file
        other.execute("COMMIT")
        ran_on, _ = await pending
        assert ran_on != me
    # Found contended: a write right after a direct commit goes to the thread (which
    # waits out DIRECT_WRITE_SPACING), so a writer of another process can get in.
    ran_on, _ = await db.write(insert(1), direct=True)
    assert ran_on == me  # the last commit was the thread's: no gap owed
    ran_on, seen = await db.write(insert(2), direct=True)
    assert ran_on != me
    assert seen == [0, 1, 2]
    await asyncio.sleep(2 * DIRECT_WRITE_SPACING)
    ran_on, _ = await db.write(insert(3), direct=True)
    assert ran_on == me  # after the gap, directly again


async def test_direct_runs_wait_for_the_worker_s_connection_or_use_the_spare_one(
    db: SQLiteDatabase,
) -> None:
    me = threading.get_ident()
    inside, release = threading.Event(), threading.Event()

    def slow(conn: sqlite3.Connection) -> int:
        conn.execute("INSERT INTO t (n) VALUES (100)")
        inside.set()
        release.wait(5)
        return threading.get_ident()

    other_handle = SQLiteDatabase(db.path, role="index")  # another store on the file
    try:
        busy = asyncio.ensure_future(other_handle.write(slow))
        await asyncio.to_thread(inside.wait, 5)
        # The worker holds the connection (mid-transaction): a direct read runs on the
        # spare connection and sees only what is committed; a direct write goes to the
        # thread, behind the running batch.
        read_on, seen = await db.read(
            lambda conn: (threading.get_ident(), [r[0] for r in conn.execute("SELECT n FROM t")]),
            direct=True,
        )
        assert (read_on, seen) == (me, [])
        write = asyncio.ensure_future(db.write(insert(1), direct=True))
        await asyncio.sleep(0.05)
        assert not write.done()
        release.set()
        worker = await busy
        written_on, seen = await write
        assert worker != me
        assert written_on == worker
        assert seen == [100, 1]
        # The worker idle again: the next direct write borrows its connection.
        written_on, seen = await db.write(insert(2), direct=True)
        assert written_on == me
        assert seen == [100, 1, 2]
    finally:
        release.set()
        await other_handle.aclose()


async def test_writes_made_in_one_turn_of_the_loop_reach_the_worker_as_one_batch(
    db: SQLiteDatabase,
) -> None:
    before = db.transactions
    results = await asyncio.gather(*(db.write(insert(n)) for n in range(20)))
    # One wake-up of the thread, one group transaction, each call in the order made.
    assert db.transactions == before + 1
    assert [seen for _, seen in results] == [list(range(n + 1)) for n in range(20)]
    assert db.queued == 0
