"""How the SQLite durable store finds dead sessions (issue #8, store migration 5).

Collection reads ``sessions.collect_at_us``, a lower bound of the session's lifetime, so
that an append to a live session, which raises the lifetime, leaves the collection index
alone (before, an index on ``expires_at_us`` moved the session's entry on every append:
one more page written per commit). These tests check the bound's bookkeeping through real
writes on a real file: a migrated file keeps its data and collects as before, a session
kept alive by later appends is never collected early (the collector raises its bound),
and a dead session started afresh with an earlier lifetime is still collected on time.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tiermem.store.backends.sqlite import MIGRATIONS, SQLiteDurableStore
from tiermem.testing import FakeClock
from tiermem.testing.backend import text_turn

HOUR = timedelta(hours=1)
GRACE = timedelta(minutes=10)
SESSION_TABLES = ("sessions", "session_records", "idempotency_keys", "turns")


def us(value: datetime) -> int:
    return (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def rows(path: Path, sql: str, *params: object) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql, params).fetchall()


def header(path: Path, session_id: str) -> tuple[object, ...] | None:
    """The session's (expires_at_us, collect_at_us), None when it has no header."""
    found = rows(
        path, "SELECT expires_at_us, collect_at_us FROM sessions WHERE session_id = ?", session_id
    )
    return found[0] if found else None


def left_of(path: Path, session_id: str) -> list[int]:
    """The session's rows in each of its tables."""
    counts: list[int] = []
    for table in SESSION_TABLES:
        # Only the constant table names above are spliced into the statement.
        sql = f"SELECT count(*) FROM {table} WHERE session_id = ?"  # noqa: S608
        (count,) = rows(path, sql, session_id)[0]
        assert isinstance(count, int)
        counts.append(count)
    return counts


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def durable(tmp_path: Path, clock: FakeClock) -> AsyncIterator[SQLiteDurableStore]:
    store = SQLiteDurableStore(tmp_path / "tiermem.db", clock=clock, gc_grace=GRACE)
    yield store
    await store.aclose()


async def collect(store: SQLiteDurableStore) -> None:
    """One collection pass, as the store runs on its first write and every 64th."""
    for _ in range(64):
        await store.append_turns("busy", [text_turn("x")])


async def test_appends_to_a_live_session_leave_its_collection_bound_alone(
    durable: SQLiteDurableStore, clock: FakeClock, tmp_path: Path
) -> None:
    path = tmp_path / "tiermem.db"
    first = clock.now() + HOUR
    await durable.append_turns("s-1", [text_turn("a")], expires_at=first)
    assert header(path, "s-1") == (us(first), us(first))
    for _ in range(3):
        clock.advance(timedelta(minutes=30))
        await durable.append_turns("s-1", [text_turn("b")], expires_at=clock.now() + HOUR)
    lifetime = clock.now() + HOUR
    assert header(path, "s-1") == (us(lifetime), us(first))  # the bound stayed put


async def test_a_session_kept_alive_is_not_collected_and_goes_once_really_dead(
    durable: SQLiteDurableStore, clock: FakeClock, tmp_path: Path
) -> None:
    path = tmp_path / "tiermem.db"
    await durable.append_turns("s-1", [text_turn("a")], expires_at=clock.now() + HOUR)
    clock.advance(HOUR - timedelta(minutes=1))
    await durable.append_turns("s-1", [text_turn("b")], expires_at=clock.now() + HOUR)
    lifetime = clock.now() + HOUR
    # Past the first lifetime and its grace: still alive, so it stays, and the collector
    # raises its bound to its lifetime.
    clock.advance(GRACE + timedelta(minutes=5))
    await collect(durable)
    assert header(path, "s-1") == (us(lifetime), us(lifetime))
    assert [t.text for t in await durable.get_turns("s-1")] == ["b"]  # "a" expired
    # Dead, but within the grace: kept.
    clock.advance(HOUR - GRACE - timedelta(minutes=5) + timedelta(minutes=1))
    await collect(durable)
    assert left_of(path, "s-1")[0] == 1
    clock.advance(GRACE)
    await collect(durable)
    assert left_of(path, "s-1") == [0, 0, 0, 0]


async def test_a_session_that_lives_forever_leaves_the_collection_index(
    durable: SQLiteDurableStore, clock: FakeClock, tmp_path: Path
) -> None:
    path = tmp_path / "tiermem.db"
    await durable.append_turns("s-1", [text_turn("a")], expires_at=clock.now() + HOUR)
    await durable.append_turns("s-1", [text_turn("b")])  # no expiry: it lives forever now
    assert header(path, "s-1") == (None, us(clock.now() + HOUR))
    clock.advance(2 * HOUR)
    await collect(durable)
    assert header(path, "s-1") == (None, None)  # found alive: out of the index
    assert [t.text for t in await durable.get_turns("s-1")] == ["b"]


async def test_a_dead_session_started_afresh_with_an_earlier_lifetime_is_collected_on_time(
    durable: SQLiteDurableStore, clock: FakeClock, tmp_path: Path
) -> None:
    path = tmp_path / "tiermem.db"
    await durable.put_record("s-1", "summary", {"text": "a"}, expires_at=clock.now() + HOUR)
    clock.advance(HOUR + timedelta(minutes=1))  # dead, within the grace
    # Started afresh with a lifetime earlier than the old one (already over): the bound
    # follows it down, so the collector does not wait for the old one.
    earlier = clock.now() - 2 * HOUR
    await durable.append_turns("s-1", [text_turn("b")], expires_at=earlier)
    assert header(path, "s-1") == (us(earlier), us(earlier))
    await collect(durable)
    assert left_of(path, "s-1") == [0, 0, 0, 0]


async def test_a_file_at_migration_4_migrates_keeps_its_sessions_and_collects(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "tiermem.db"
    now_us = us(clock.now())
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("BEGIN")
        for migration in MIGRATIONS[:4]:
            for statement in migration:
                conn.execute(statement)
        conn.execute("PRAGMA user_version = 4")
        sessions = {
            "live": now_us + 3_600_000_000,
            "dead": now_us - 7_200_000_000,  # past its lifetime and the grace
            "forever": None,
        }
        for session_id, expires in sessions.items():
            conn.execute(
                "INSERT INTO sessions (session_id, next_index, expires_at_us) VALUES (?, 1, ?)",
                (session_id, expires),
            )
            conn.execute(
                "INSERT INTO turns (session_id, idx, payload, expires_at_us) VALUES (?, 0, ?, ?)",
                (session_id, text_turn(session_id).with_index(0).model_dump_json(), expires),
            )
        conn.execute("COMMIT")
    store = SQLiteDurableStore(path, clock=clock, gc_grace=GRACE)
    try:
        assert [t.text for t in await store.get_turns("live")] == ["live"]
        assert rows(path, "PRAGMA user_version") == [(len(MIGRATIONS),)]
        for session_id, expires in sessions.items():
            assert header(path, session_id) == (expires, expires)
        indexes = {name for (name,) in rows(path, "SELECT name FROM sqlite_master")}
        assert "sessions_by_collection" in indexes
        assert "sessions_by_expiry" not in indexes
        await store.append_turns("busy", [text_turn("x")])  # the first write collects
        assert left_of(path, "dead") == [0, 0, 0, 0]
        assert [t.text for t in await store.get_turns("forever")] == ["forever"]
        appended = await store.append_turns("live", [text_turn("more")])
        assert [t.index for t in appended] == [1]  # the next index survived the migration
    finally:
        await store.aclose()


async def test_a_header_inserted_by_older_code_still_gets_collected(
    durable: SQLiteDurableStore, clock: FakeClock, tmp_path: Path
) -> None:
    """A worker still running code from before migration 5 (a rolling restart sharing
    the file) inserts headers without ``collect_at_us``; the migration's trigger gives
    them their lifetime as the bound, so they are collected like any other."""
    path = tmp_path / "tiermem.db"
    await durable.append_turns("s-new", [text_turn("a")], expires_at=clock.now() + HOUR)
    lifetime = clock.now() + HOUR
    with closing(sqlite3.connect(path)) as conn, conn:  # the old code's header insert
        conn.execute(
            "INSERT INTO sessions (session_id, next_index, expires_at_us) VALUES (?, ?, ?) "
            "ON CONFLICT (session_id) DO UPDATE SET next_index = excluded.next_index, "
            "expires_at_us = excluded.expires_at_us",
            ("s-old", 0, us(lifetime)),
        )
    assert header(path, "s-old") == (us(lifetime), us(lifetime))
    clock.advance(HOUR + GRACE + timedelta(minutes=1))
    await collect(durable)
    assert header(path, "s-old") is None
    assert left_of(path, "s-new") == [0, 0, 0, 0]
