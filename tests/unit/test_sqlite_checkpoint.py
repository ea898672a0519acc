"""The SQLite checkpointer thread (tiermem.store.backends.sqlite._checkpoint): writes never
wait for a checkpoint's copying, the WAL still starts over (it does not grow without end)
whether writes run directly or in group commits, large turns wake the thread by the WAL's
length (and the WAL file is cut back after them), a failed checkpoint loses nothing and
creates nothing, and the thread ends with its store.

Real SQLite files throughout. One test holds a checkpoint in the middle of its copying
by wrapping the module's ``_passive`` (a real ``PRAGMA wal_checkpoint`` runs after the
hold): a real checkpoint is over in milliseconds, too quick to write beside on purpose.
Another makes ``_passive`` raise, a fault a healthy file never produces.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import tiermem.store.backends.sqlite._checkpoint as checkpoint_module
from tests.unit._sqlite_helpers import raw
from tiermem.store.backends.sqlite import SQLiteDurableStore
from tiermem.store.backends.sqlite._checkpoint import (
    CHECKPOINT_FRAMES,
    LOOK_EVERY,
    Checkpointer,
)
from tiermem.store.backends.sqlite._open import WAL_SIZE_LIMIT
from tiermem.testing import FakeClock
from tiermem.testing.backend import text_turn

WAIT = 30.0
"""Seconds a test waits for the checkpointer thread at most (it takes milliseconds)."""


@pytest.fixture
async def durable(tmp_path: Path) -> AsyncIterator[SQLiteDurableStore]:
    store = SQLiteDurableStore(tmp_path / "tiermem.db", clock=FakeClock())
    yield store
    await store.aclose()


def checkpointer_of(store: SQLiteDurableStore) -> Checkpointer:
    return store._db._engine._worker.checkpointer


async def checkpoint_now(store: SQLiteDurableStore) -> None:
    done = checkpointer_of(store).run_now()
    assert await asyncio.to_thread(done.wait, WAIT), "the checkpointer did not answer"


def wal_frames(path: Path) -> int:
    """Frames in the WAL now (a passive checkpoint of another connection reports them)."""
    with raw(path) as conn:
        _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return int(frames)


async def append_many(
    store: SQLiteDurableStore, sessions: int, turns: int, size: int = 2000
) -> None:
    """``turns`` turns of about ``size`` bytes in each of ``sessions`` sessions, the
    sessions writing at once (so their appends go to the worker thread and share commits)
    or, for one, one by one (mostly direct). A 2,000-byte turn fills about half a page."""

    async def one(sid: str) -> None:
        for i in range(turns):
            await store.append_turns(sid, [text_turn(f"{sid} turn {i} " + "x" * size)])

    await asyncio.gather(*(one(f"s-{k}") for k in range(sessions)))


async def test_writes_go_on_while_a_checkpoint_copies(
    durable: SQLiteDurableStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await append_many(durable, sessions=1, turns=3)  # the thread opens the file
    copying, release = threading.Event(), threading.Event()
    real = checkpoint_module._passive

    def held(conn: sqlite3.Connection) -> tuple[bool, int, int]:
        if not release.is_set():
            copying.set()
            release.wait(WAIT)
        return real(conn)

    monkeypatch.setattr(checkpoint_module, "_passive", held)
    done = checkpointer_of(durable).run_now()
    assert await asyncio.to_thread(copying.wait, WAIT)
    try:
        # Both ways a write runs: direct (one session) and on the worker thread (many at
        # once). Had a checkpoint run inside a commit, as SQLite's automatic one does,
        # these would wait for it.
        await asyncio.wait_for(append_many(durable, sessions=1, turns=5), WAIT / 2)
        await asyncio.wait_for(append_many(durable, sessions=20, turns=3), WAIT / 2)
        assert not done.is_set()  # the checkpoint was still held all along
    finally:
        release.set()
    assert await asyncio.to_thread(done.wait, WAIT)
    assert checkpointer_of(durable).checkpoints == 1
    assert await durable.next_index("s-19") == 3


@pytest.mark.parametrize("sessions", [1, 40], ids=["direct", "group-commits"])
async def test_the_wal_starts_over_instead_of_growing(
    durable: SQLiteDurableStore, tmp_path: Path, sessions: int
) -> None:
    turns = 4 * CHECKPOINT_FRAMES // sessions  # at least 2,000 pages of turn rows
    await append_many(durable, sessions=sessions, turns=turns)
    await checkpoint_now(durable)  # after those the writes woke, if still under way
    checkpointer = checkpointer_of(durable)
    # The WAL reached CHECKPOINT_FRAMES at least twice on the way, and the thread
    # started it over itself (a writer may also have, after a pass caught up).
    assert checkpointer.checkpoints >= 2
    assert checkpointer.restarts >= 1
    # A WAL never started over would still hold every page written; started over by the
    # last checkpoint, it holds only that checkpoint's one-page write.
    assert wal_frames(tmp_path / "tiermem.db") <= 2


async def test_large_turns_wake_the_thread_by_the_wals_length(
    durable: SQLiteDurableStore,
) -> None:
    """60 KB turns fill about 15 pages each: the WAL reaches CHECKPOINT_FRAMES after
    about 70 appends, far fewer writes than small turns take, and the thread is woken
    then, without being asked."""
    checkpointer = checkpointer_of(durable)
    appends = 10 * LOOK_EVERY
    await append_many(durable, sessions=1, turns=appends, size=60_000)
    for _ in range(int(WAIT * 10)):  # woken by the writes alone: no run_now here
        if checkpointer.restarts:
            break
        await asyncio.sleep(0.1)
    assert checkpointer.checkpoints >= 1
    assert checkpointer.restarts >= 1
    assert await durable.next_index("s-0") == appends


async def test_a_burst_that_grew_the_wal_file_is_cut_back(
    durable: SQLiteDurableStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes faster than the thread is woken grow the WAL file past WAL_SIZE_LIMIT; the
    restart after them truncates it (a WAL file otherwise keeps its largest size)."""
    monkeypatch.setattr(checkpoint_module, "CHECKPOINT_FRAMES", 10**9)  # no wake-ups
    wal = tmp_path / "tiermem.db-wal"
    turns = 2 * WAL_SIZE_LIMIT // 60_000
    await append_many(durable, sessions=1, turns=turns, size=60_000)
    assert wal.stat().st_size > WAL_SIZE_LIMIT
    await checkpoint_now(durable)
    assert checkpointer_of(durable).restarts == 1
    assert wal.stat().st_size <= WAL_SIZE_LIMIT
    assert await durable.next_index("s-0") == turns


async def test_no_write_checkpoints_on_its_own(
    durable: SQLiteDurableStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the checkpointer never woken, the WAL keeps every frame, past SQLite's
    default automatic checkpoint (1,000 pages): neither the worker thread's commits nor
    the direct ones copied the WAL themselves."""
    monkeypatch.setattr(checkpoint_module, "CHECKPOINT_FRAMES", 10**9)
    await append_many(durable, sessions=1, turns=300)
    await append_many(durable, sessions=30, turns=15)
    assert wal_frames(tmp_path / "tiermem.db") > 1000
    assert checkpointer_of(durable).checkpoints == 0


async def test_a_failed_checkpoint_is_logged_and_the_next_one_catches_up(
    durable: SQLiteDurableStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await append_many(durable, sessions=1, turns=100)
    real = checkpoint_module._passive

    def failing(conn: sqlite3.Connection) -> tuple[bool, int, int]:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(checkpoint_module, "_passive", failing)
    checkpointer = checkpointer_of(durable)
    with caplog.at_level(logging.DEBUG, logger=checkpoint_module.__name__):
        await checkpoint_now(durable)
        await checkpoint_now(durable)
    # The first of a run of failures is a warning saying what to do; the repeats are
    # debug lines, counted.
    assert checkpointer.failures == 2
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.DEBUG]
    assert "disk I/O error" in caplog.records[0].getMessage()
    assert "check the disk" in caplog.records[0].getMessage()
    assert wal_frames(tmp_path / "tiermem.db") > 100  # nothing copied
    # Writes go on, every turn is there, and the next checkpoint starts the WAL over.
    await append_many(durable, sessions=1, turns=10)
    monkeypatch.setattr(checkpoint_module, "_passive", real)
    await checkpoint_now(durable)
    assert await durable.next_index("s-0") == 110
    assert wal_frames(tmp_path / "tiermem.db") <= 2
    # After a success, the next failure is a warning again.
    caplog.clear()
    monkeypatch.setattr(checkpoint_module, "_passive", failing)
    with caplog.at_level(logging.DEBUG, logger=checkpoint_module.__name__):
        await checkpoint_now(durable)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


async def test_a_file_removed_under_the_store_is_not_created_again(
    durable: SQLiteDurableStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The checkpointer opens its connection on its first checkpoint, maybe long after
    the store opened the file: a file removed meanwhile is a logged failure, not a new
    empty database at the path."""
    await append_many(durable, sessions=1, turns=3)
    db = tmp_path / "tiermem.db"
    db.unlink()  # the store's open connection keeps the removed file's data
    with caplog.at_level(logging.WARNING, logger=checkpoint_module.__name__):
        await checkpoint_now(durable)
    assert checkpointer_of(durable).failures == 1
    assert "unable to open" in caplog.text
    assert not db.exists()


async def test_the_thread_ends_with_its_store(tmp_path: Path) -> None:
    store = SQLiteDurableStore(tmp_path / "tiermem.db", clock=FakeClock())
    await append_many(store, sessions=1, turns=3)
    await checkpoint_now(store)
    checkpointer = checkpointer_of(store)
    thread = checkpointer._thread
    assert thread is not None
    assert thread.is_alive()
    await store.aclose()
    assert not thread.is_alive()
    # The worker's connection closed last, so SQLite copied the rest and removed the WAL.
    assert not (tmp_path / "tiermem.db-wal").exists()
    # Closed, it starts no thread again; a caller waiting on it is not left hanging.
    assert checkpointer.run_now().is_set()
    assert checkpointer._thread is thread
    with raw(tmp_path / "tiermem.db") as conn:  # the last connection closed cleanly
        assert conn.execute("SELECT count(*) FROM turns").fetchone() == (3,)
