"""What the SQLite backend promises beyond the shared contract (tests/conformance covers that):
migrations (dropping the old ``memories_fts``; session headers from the old tables),
persistence across instances, the default path, atomicity of failed writes, lock errors,
physical collection of expired rows and dead sessions, the statements an append costs, group
commit (many callers' writes in one transaction, each failing on its own), one worker per
file shared with recall's index, direct runs of small operations, the decoded-turn cache,
the index keeping unchanged full-text rows, and the durability setting. The checkpoints
that keep the WAL bounded are in test_sqlite_checkpoint.py."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import pytest

from tests.unit._sqlite_helpers import raw, traced
from tiermem.composition import open_durable_store, open_hot_store
from tiermem.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ConflictError,
    ValidationError,
)
from tiermem.longterm.index import IndexedDoc
from tiermem.longterm.index_sqlite import INDEX_COMPONENT, SQLiteIndex
from tiermem.models import (
    ActiveEntity,
    MemoryRecord,
    SessionMetadata,
    SessionRef,
    StateBlob,
    Turn,
)
from tiermem.settings import TierMemSettings
from tiermem.store.backends.sqlite import (
    MIGRATIONS,
    SQLiteDurableStore,
    SQLiteHotStore,
    default_data_dir,
    default_database_path,
)
from tiermem.store.backends.sqlite._paths import data_dir_for
from tiermem.store.backends.sqlite._schema import apply_migrations
from tiermem.store.codec import encode_memory
from tiermem.store.contract import (
    ENTITIES_RECORD,
    Capability,
    DurableStore,
    EntityChange,
    HotStore,
)
from tiermem.testing import FakeClock
from tiermem.testing.backend import text_turn

HOUR = timedelta(hours=1)
T = TypeVar("T")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "tiermem.db"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def hot(db_path: Path, clock: FakeClock) -> AsyncIterator[SQLiteHotStore]:
    store = SQLiteHotStore(db_path, clock=clock)
    yield store
    await store.aclose()


@pytest.fixture
async def durable(db_path: Path, clock: FakeClock) -> AsyncIterator[SQLiteDurableStore]:
    store = SQLiteDurableStore(db_path, clock=clock)
    yield store
    await store.aclose()


def memory(
    clock: FakeClock, user_id: str, memory_id: str, content: str, **extra: object
) -> MemoryRecord:
    return MemoryRecord.model_validate(
        {
            "memory_id": memory_id,
            "user_id": user_id,
            "memory_type": "preference",
            "content": content,
            "created_at": clock.now(),
            **extra,
        }
    )


def test_stores_declare_name_capabilities_and_protocols(db_path: Path) -> None:
    hot, durable = SQLiteHotStore(db_path), SQLiteDurableStore(db_path)
    assert isinstance(hot, HotStore)
    assert isinstance(durable, DurableStore)
    assert hot.name == durable.name == "sqlite"
    assert Capability.PERSISTENT in hot.capabilities
    assert Capability.PERSISTENT in durable.capabilities
    # Recall's SQLiteIndex does the searching; the store keeps no full-text index.
    assert Capability.FULL_TEXT_SEARCH not in durable.capabilities


@pytest.mark.parametrize("path", [":memory:", "", "file::memory:?cache=shared"])
def test_a_file_path_is_required(path: str) -> None:
    with pytest.raises(ValidationError, match="file path"):
        SQLiteHotStore(path)


# -- migrations and persistence ----------------------------------------------------------


def test_migrations_are_applied_once_and_recorded(db_path: Path) -> None:
    with raw(db_path) as conn:
        assert apply_migrations(conn, path=str(db_path)) == list(range(1, len(MIGRATIONS) + 1))
        assert apply_migrations(conn, path=str(db_path)) == []
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def own_connection(i: int) -> timedelta:
    """A busy timeout no other store of the test uses: stores with other settings on the
    same file get a connection (and thread) of their own, as another process would."""
    return timedelta(seconds=5, milliseconds=i + 1)


async def test_stores_opening_a_new_file_at_once_migrate_it_once(db_path: Path) -> None:
    stores = [SQLiteHotStore(db_path, busy_timeout=own_connection(i)) for i in range(4)] + [
        SQLiteDurableStore(db_path, busy_timeout=own_connection(4 + i)) for i in range(4)
    ]
    try:
        # Each store opens (and would migrate) on its own thread, all at the same time.
        await asyncio.gather(
            *(
                s.load("s-1") if isinstance(s, SQLiteHotStore) else s.next_index("s-1")
                for s in stores
            )
        )
    finally:
        for store in stores:
            await store.aclose()
    with raw(db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_a_file_at_migration_1_loses_memories_fts_and_keeps_its_memories(
    db_path: Path, clock: FakeClock
) -> None:
    # The file as the previous release left it: migration 1 only, a memory and its FTS row.
    record = memory(clock, "u-1", "m-1", "likes seinen manga")
    with raw(db_path) as conn:
        conn.execute("BEGIN")
        for statement in MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        conn.execute(
            "INSERT INTO memories (user_id, memory_id, memory_type, created_at_us, "
            "expires_at_us, version, payload) VALUES (?, ?, ?, ?, NULL, 1, ?)",
            ("u-1", "m-1", "preference", 0, encode_memory(record)),
        )
        conn.execute(
            "INSERT INTO memories_fts (rowid, content, tags, user_id, memory_id) "
            "VALUES (last_insert_rowid(), ?, '', 'u-1', 'm-1')",
            (record.content,),
        )
        conn.execute("COMMIT")
    store = SQLiteDurableStore(db_path, clock=clock)
    try:
        assert await store.get_memory("u-1", "m-1") == record
        assert await store.delete_memory("u-1", "m-1") is True
    finally:
        await store.aclose()
    with raw(db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert "memories_fts" not in table_names(conn)


def at_migration(conn: sqlite3.Connection, version: int) -> None:
    """Make ``conn``'s new file look as a release at migration ``version`` left it."""
    conn.execute("BEGIN")
    for migration in MIGRATIONS[:version]:
        for statement in migration:
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {int(version)}")
    conn.execute("COMMIT")


def us(value: datetime) -> int:
    return (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


async def test_a_file_at_migration_2_gets_session_headers_with_owners_and_lifetimes(
    db_path: Path, clock: FakeClock
) -> None:
    now = clock.now()
    day = now + 24 * HOUR
    turn = text_turn("a").with_index(0).model_dump_json()
    refs = {
        (sid, user): SessionRef(session_id=sid, user_id=user, created_at=now - age * HOUR)
        for sid, user, age in [
            ("s-live", "u-1", 2),
            ("s-live", "u-2", 1),
            ("s-registered", "u-3", 0),
            ("s-collected", "u-1", 0),
        ]
    }
    with raw(db_path) as conn:
        at_migration(conn, 2)
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO user_sessions (user_id, session_id, created_at_us, payload) "
            "VALUES (?, ?, ?, ?)",
            [(u, s, us(r.created_at), r.model_dump_json()) for (s, u), r in refs.items()],
        )
        # s-live: 3 turns kept for a day, a record for 2 hours. s-collected: its turns were
        # all collected already. s-forever: one turn kept forever.
        conn.executemany(
            "INSERT INTO archive_heads (session_id, next_index) VALUES (?, ?)",
            [("s-live", 3), ("s-collected", 5), ("s-forever", 1)],
        )
        conn.executemany(
            "INSERT INTO turns (session_id, idx, payload, expires_at_us) VALUES (?, ?, ?, ?)",
            [("s-live", i, turn, us(day)) for i in range(3)] + [("s-forever", 0, turn, None)],
        )
        conn.executemany(
            "INSERT INTO session_records (session_id, kind, version, payload, expires_at_us) "
            'VALUES (?, ?, 1, \'{"kind": "x", "data": {}, "version": 1, '
            '"updated_at": "2030-01-01T00:00:00Z"}\', ?)',
            [
                ("s-live", "summary", us(now + 2 * HOUR)),
                ("s-forever", "summary", us(now)),
                # Expired by the wall clock at migration time: it must not come back to life.
                ("s-forever", "stale", us(datetime(2001, 1, 1, tzinfo=UTC))),
            ],
        )
        conn.execute("COMMIT")
    store = SQLiteDurableStore(db_path, clock=clock)
    try:
        # The earliest registration owns the session; the later one is refused.
        assert await store.get_session("s-live") == refs["s-live", "u-1"]
        assert await store.register_session(refs["s-live", "u-2"]) == refs["s-live", "u-1"]
        assert await store.next_index("s-live") == 3
        assert await store.get_session("s-registered") == refs["s-registered", "u-3"]
        assert await store.get_session("s-collected") is None  # nothing of it was left
        assert await store.get_record("s-forever", "stale") is None
        assert [r.session_id for r in await store.list_sessions("u-2")] == ["s-live"]
        clock.set(day - timedelta(microseconds=1))
        # The record outlives its own old expiry: it lives as long as the session now.
        assert await store.get_record("s-live", "summary") is not None
        assert await store.get_session("s-live") == refs["s-live", "u-1"]
        clock.set(day)
        assert await store.get_record("s-live", "summary") is None
        assert await store.get_session("s-live") is None
        clock.advance(400 * 24 * HOUR)
        assert await store.get_session("s-registered") == refs["s-registered", "u-3"]
        assert await store.get_record("s-forever", "summary") is not None
        assert (await store.append_turns("s-forever", [text_turn("b")]))[0].index == 1
    finally:
        await store.aclose()
    with raw(db_path) as conn:
        assert "archive_heads" not in table_names(conn)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(session_records)")}
        assert columns == {"session_id", "kind", "version", "payload"}


async def test_a_new_file_has_no_memories_fts(durable: SQLiteDurableStore, db_path: Path) -> None:
    await durable.next_index("s-1")  # opens, so migrates, the file
    with raw(db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        names = table_names(conn)
    assert "memories" in names
    assert not any(name.startswith("memories_fts") for name in names)


def table_names(conn: sqlite3.Connection) -> set[str]:
    return {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}


async def test_a_file_from_a_newer_tiermem_is_refused(db_path: Path) -> None:
    with raw(db_path) as conn:
        conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    store = SQLiteDurableStore(db_path)
    try:
        with pytest.raises(BackendError, match="Upgrade tiermem"):
            await store.next_index("s-1")
    finally:
        await store.aclose()


async def test_data_survives_reopening_the_file(db_path: Path, clock: FakeClock) -> None:
    hot, durable = SQLiteHotStore(db_path, clock=clock), SQLiteDurableStore(db_path, clock=clock)
    await hot.append_turns(
        "s-1", [text_turn("こんにちは")], window=5, expires_at=clock.now() + HOUR
    )
    await hot.put_state("s-1", "dialogue", {"phase": "greeting"}, expires_at=clock.now() + HOUR)
    await durable.append_turns("s-1", [text_turn("a"), text_turn("b")])
    await durable.put_record("s-1", "summary", {"text": "greeted"})
    await durable.register_session(
        SessionRef(session_id="s-1", user_id="u-1", created_at=clock.now())
    )
    stored = await durable.put_memory(memory(clock, "u-1", "m-1", "likes seinen manga"))
    await hot.aclose()
    await durable.aclose()

    hot, durable = SQLiteHotStore(db_path, clock=clock), SQLiteDurableStore(db_path, clock=clock)
    try:
        snap = await hot.load("s-1")
        assert snap is not None
        assert [t.text for t in snap.turns] == ["こんにちは"]
        assert snap.state["dialogue"].data == {"phase": "greeting"}
        assert snap.version == 2
        assert [t.text for t in await durable.get_turns("s-1")] == ["a", "b"]
        assert await durable.next_index("s-1") == 2
        record = await durable.get_record("s-1", "summary")
        assert record is not None
        assert record.data == {"text": "greeted"}
        assert [r.session_id for r in await durable.list_sessions("u-1")] == ["s-1"]
        assert await durable.get_memory("u-1", "m-1") == stored
        # Expiry still follows the clock after a reopen.
        clock.advance(HOUR)
        assert await hot.load("s-1") is None
    finally:
        await hot.aclose()
        await durable.aclose()


async def test_a_closed_store_refuses_work(db_path: Path) -> None:
    store = SQLiteDurableStore(db_path)
    await store.next_index("s-1")
    await store.aclose()
    await store.aclose()  # closing twice is harmless
    with pytest.raises(BackendUnavailableError, match="closed"):
        await store.next_index("s-1")


# -- atomicity and errors -------------------------------------------------------------------


def install_failure(path: Path, table: str, event: str, when: str) -> None:
    """Make SQLite abort statements on ``table`` that match ``when``, as a disk error would."""
    with raw(path) as conn:
        conn.execute(
            f"CREATE TRIGGER injected_failure BEFORE {event} ON {table} WHEN {when} "
            "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
        )


async def test_a_failed_hot_write_leaves_earlier_data_intact(
    hot: SQLiteHotStore, clock: FakeClock, db_path: Path
) -> None:
    before = await hot.append_turns(
        "s-1", [text_turn("a"), text_turn("b")], window=10, expires_at=clock.now() + HOUR
    )
    install_failure(db_path, "hot_turns", "INSERT", "NEW.idx = 3")
    with pytest.raises(BackendError, match="injected failure"):
        # Turn 2 is written and the session row updated before turn 3 fails.
        await hot.append_turns(
            "s-1", [text_turn("c"), text_turn("d")], window=10, expires_at=clock.now() + 2 * HOUR
        )
    snap = await hot.load("s-1")
    assert snap is not None
    assert snap.turns == before.turns
    assert (snap.version, snap.next_index) == (1, 2)
    assert snap.expires_at == clock.now() + HOUR


async def test_a_failed_archive_write_leaves_earlier_data_intact(
    durable: SQLiteDurableStore, db_path: Path
) -> None:
    await durable.append_turns("s-1", [text_turn("a")])
    install_failure(db_path, "turns", "INSERT", "NEW.idx = 2")
    with pytest.raises(BackendError):
        await durable.append_turns("s-1", [text_turn("b"), text_turn("c")])
    assert await durable.next_index("s-1") == 1
    assert [t.text for t in await durable.get_turns("s-1")] == ["a"]


async def test_a_failed_purge_leaves_sessions_and_memories_intact(
    durable: SQLiteDurableStore, clock: FakeClock, db_path: Path
) -> None:
    await durable.append_turns("s-1", [text_turn("a")])
    await durable.register_session(
        SessionRef(session_id="s-1", user_id="u-1", created_at=clock.now())
    )
    stored = await durable.put_memory(memory(clock, "u-1", "m-1", "likes seinen"))
    install_failure(db_path, "memories", "DELETE", "1")
    with pytest.raises(BackendError, match="injected failure"):
        await durable.purge_user("u-1")  # sessions go first, then the memories' delete fails
    assert [t.text for t in await durable.get_turns("s-1")] == ["a"]
    assert [r.session_id for r in await durable.list_sessions("u-1")] == ["s-1"]
    assert await durable.get_memory("u-1", "m-1") == stored


async def test_a_write_lock_held_elsewhere_is_a_retryable_timeout(
    db_path: Path, clock: FakeClock
) -> None:
    store = SQLiteDurableStore(db_path, clock=clock, busy_timeout=timedelta(milliseconds=50))
    try:
        await store.append_turns("s-1", [text_turn("a")])
        with raw(db_path) as other:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(BackendTimeoutError) as info:
                await store.append_turns("s-1", [text_turn("b")])
            assert info.value.retryable is True
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
            # Readers are not blocked by a writer in WAL mode.
            assert await store.next_index("s-1") == 1
            other.execute("ROLLBACK")
        assert (await store.append_turns("s-1", [text_turn("b")]))[0].index == 1
    finally:
        await store.aclose()


async def test_appends_through_two_connections_are_gap_free(
    db_path: Path, clock: FakeClock
) -> None:
    stores = [
        SQLiteDurableStore(db_path, clock=clock, busy_timeout=own_connection(i)) for i in range(2)
    ]

    async def writer(store: SQLiteDurableStore, w: int) -> None:
        for i in range(15):
            await store.append_turns("s-1", [text_turn(f"w{w}-{i}")])

    try:
        await asyncio.gather(*(writer(stores[w % 2], w) for w in range(6)))
        turns = await stores[0].get_turns("s-1")
    finally:
        for store in stores:
            await store.aclose()
    assert [t.index for t in turns] == list(range(90))
    assert len({t.text for t in turns}) == 90


# -- timestamps and garbage collection -------------------------------------------------------


async def test_timestamps_compare_at_microsecond_precision(
    durable: SQLiteDurableStore, clock: FakeClock
) -> None:
    base = datetime(2030, 1, 1, 12, 0, 0, 500, tzinfo=UTC)
    # Same millisecond, different microseconds: the order must still be exact.
    for i, micro in enumerate([100, 900, 500]):
        await durable.put_memory(
            memory(clock, "u-1", f"m-{i}", f"c{i}", created_at=base.replace(microsecond=micro))
        )
    newest_first = await durable.query_memories("u-1")
    assert [r.memory_id for r in newest_first] == ["m-1", "m-2", "m-0"]
    since = await durable.query_memories("u-1", since=base.replace(microsecond=500))
    assert [r.memory_id for r in since] == ["m-1", "m-2"]


def count_rows(path: Path, table: str, session_id: str) -> int:
    with raw(path) as conn:
        return int(
            conn.execute(
                f"SELECT count(*) FROM {table} WHERE session_id = ?",  # noqa: S608 -- test constant
                (session_id,),
            ).fetchone()[0]
        )


async def test_long_expired_hot_sessions_are_collected_but_stay_claimable(
    db_path: Path, clock: FakeClock
) -> None:
    hot = SQLiteHotStore(db_path, clock=clock, gc_grace=timedelta(minutes=10))
    try:
        await hot.append_turns("old", [text_turn("a")], window=5, expires_at=clock.now() + HOUR)
        clock.advance(HOUR + timedelta(minutes=5))
        for _ in range(64):  # within the grace: nothing collected yet
            await hot.touch("nobody", expires_at=clock.now() + HOUR)
            await hot.append_turns(
                "busy", [text_turn("x")], window=1, expires_at=clock.now() + HOUR
            )
        assert count_rows(db_path, "hot_turns", "old") == 1
        clock.advance(timedelta(minutes=6))
        for _ in range(64):
            await hot.append_turns(
                "busy", [text_turn("x")], window=1, expires_at=clock.now() + HOUR
            )
        assert count_rows(db_path, "hot_turns", "old") == 0
        assert count_rows(db_path, "hot_sessions", "old") == 0
        assert await hot.claim_expired(owner="w", lease=timedelta(minutes=1)) == ["old"]
    finally:
        await hot.aclose()


async def test_expired_archive_turns_are_collected_without_reusing_indexes(
    durable: SQLiteDurableStore, clock: FakeClock, db_path: Path
) -> None:
    await durable.append_turns("s-1", [text_turn("short")], expires_at=clock.now() + HOUR)
    clock.advance(HOUR)
    for i in range(64):
        await durable.append_turns("s-2", [text_turn(f"t{i}")])
    assert count_rows(db_path, "turns", "s-1") == 0
    assert await durable.next_index("s-1") == 1
    assert (await durable.append_turns("s-1", [text_turn("next")]))[0].index == 1


async def test_a_long_dead_session_is_collected_whole_and_its_id_starts_at_0(
    db_path: Path, clock: FakeClock
) -> None:
    durable = SQLiteDurableStore(db_path, clock=clock, gc_grace=timedelta(minutes=10))
    ref = SessionRef(session_id="old", user_id="u-1", created_at=clock.now())
    try:
        await durable.register_session(ref, expires_at=clock.now() + HOUR)
        await durable.append_turns(
            "old", [text_turn("a")], expires_at=clock.now() + HOUR, idempotency_key="k-1"
        )
        await durable.put_record("old", "summary", {"text": "a"}, expires_at=clock.now() + HOUR)
        clock.advance(HOUR + timedelta(minutes=5))
        for _ in range(64):  # dead, but within the grace: only its expired turn goes
            await durable.append_turns("busy", [text_turn("x")])
        assert [count_rows(db_path, table, "old") for table in SESSION_TABLES] == [1, 1, 1, 0]
        clock.advance(timedelta(minutes=6))
        for _ in range(64):
            await durable.append_turns("busy", [text_turn("x")])
        assert [count_rows(db_path, table, "old") for table in SESSION_TABLES] == [0, 0, 0, 0]
        # The owner's list keeps it as history, as the reference does.
        assert await durable.list_sessions("u-1") == [ref]
        # Nothing is left to collide with: a new session under the id starts at index 0.
        again = await durable.append_turns("old", [text_turn("new")], idempotency_key="k-1")
        assert [(t.index, t.text) for t in again] == [(0, "new")]
    finally:
        await durable.aclose()


SESSION_TABLES = ("sessions", "session_records", "idempotency_keys", "turns")


async def test_collecting_a_dead_session_takes_bounded_steps(
    db_path: Path, clock: FakeClock
) -> None:
    durable = SQLiteDurableStore(db_path, clock=clock, gc_grace=timedelta(0))
    try:
        for i in range(120):
            await durable.append_turns(
                "big", [text_turn(f"t{i}")], expires_at=clock.now() + HOUR, idempotency_key=f"k-{i}"
            )
        clock.advance(HOUR)
        for _ in range(64):  # exactly one collection pass: 100 keys at most
            await durable.append_turns("busy", [text_turn("x")])
        assert count_rows(db_path, "idempotency_keys", "big") == 20
        assert count_rows(db_path, "sessions", "big") == 1  # its keys are not all gone yet
        for _ in range(64):
            await durable.append_turns("busy", [text_turn("x")])
        assert [count_rows(db_path, table, "big") for table in SESSION_TABLES] == [0, 0, 0, 0]
    finally:
        await durable.aclose()


async def test_a_write_to_a_dead_session_drops_what_it_left_before_collection(
    durable: SQLiteDurableStore, clock: FakeClock
) -> None:
    await durable.register_session(
        SessionRef(session_id="s-1", user_id="u-1", created_at=clock.now()),
        expires_at=clock.now() + HOUR,
    )
    await durable.append_turns(
        "s-1", [text_turn("a")], expires_at=clock.now() + HOUR, idempotency_key="k"
    )
    await durable.put_record("s-1", "summary", {"text": "a"}, expires_at=clock.now() + HOUR)
    clock.advance(HOUR)
    # Not collected yet (within the grace), and written to again by a stranger.
    again = await durable.append_turns(
        "s-1", [text_turn("b")], expires_at=clock.now() + HOUR, idempotency_key="k"
    )
    assert [(t.index, t.text) for t in again] == [(1, "b")]  # a new append, not a retry
    assert await durable.get_session("s-1") is None
    assert await durable.get_record("s-1", "summary") is None  # the new lifetime is not its
    assert [t.text for t in await durable.get_turns("s-1")] == ["b"]


async def test_an_idempotency_key_is_written_with_the_turns_or_not_at_all(
    durable: SQLiteDurableStore, db_path: Path
) -> None:
    await durable.append_turns("s-1", [text_turn("a")])
    install_failure(db_path, "turns", "INSERT", "NEW.idx = 2")
    with pytest.raises(BackendError, match="injected failure"):
        await durable.append_turns("s-1", [text_turn("b"), text_turn("c")], idempotency_key="k")
    with raw(db_path) as conn:
        conn.execute("DROP TRIGGER injected_failure")
    install_failure(db_path, "idempotency_keys", "INSERT", "1")
    with pytest.raises(BackendError, match="injected failure"):
        await durable.append_turns("s-1", [text_turn("b"), text_turn("c")], idempotency_key="k")
    with raw(db_path) as conn:
        conn.execute("DROP TRIGGER injected_failure")
    assert await durable.next_index("s-1") == 1
    # Neither failure left the key behind: the retry appends.
    retry = await durable.append_turns("s-1", [text_turn("b"), text_turn("c")], idempotency_key="k")
    assert [t.index for t in retry] == [1, 2]


async def test_an_append_updates_its_header_then_reads_it(durable: SQLiteDurableStore) -> None:
    await durable.append_turns("warm-up", [text_turn("x")])  # opens the file; the GC's turn
    statements = await traced(durable)
    await durable.append_turns(
        "s-1", [text_turn("a"), text_turn("b")], expires_at=datetime(2031, 1, 1, tzinfo=UTC)
    )
    # A new session: the update finds no header, so the header is read and upserted.
    assert statements == [
        "BEGIN IMMEDIATE",
        "UPDATE sessions SET",
        "SELECT s.next_index, s.expires_at_us,",
        "INSERT INTO turns",
        "INSERT INTO turns",
        "INSERT INTO sessions",
        # A new header: migration 5's insert trigger (its WHEN is false here) is
        # traced with the text of the statement that fired it.
        "INSERT INTO sessions",
        "COMMIT",
    ]
    statements.clear()
    # A live session: the update moves the header, then its index is read back.
    await durable.append_turns("s-1", [text_turn("c")], idempotency_key="k")
    assert statements == [
        "BEGIN IMMEDIATE",
        "UPDATE sessions SET",
        "SELECT next_index, expires_at_us",
        "INSERT INTO turns",
        "INSERT INTO idempotency_keys",
        "COMMIT",
    ]
    statements.clear()
    await durable.append_turns("s-1", [text_turn("c")], idempotency_key="k")  # a retry
    assert statements == [
        "BEGIN IMMEDIATE",
        "UPDATE sessions SET",
        "SELECT s.next_index, s.expires_at_us,",
        "SELECT payload FROM",
        "COMMIT",
    ]


async def test_an_entity_change_rides_in_the_appends_transaction(
    durable: SQLiteDurableStore, clock: FakeClock
) -> None:
    await durable.append_turns("warm-up", [text_turn("x")])  # opens the file; the GC's turn
    statements = await traced(durable)
    transactions = durable._db.transactions
    series = ActiveEntity(kind="series", value="Berserk", updated_at=clock.now())
    await durable.append_turns(
        "s-1", [text_turn("Berserk 42")], entities=EntityChange(upsert={"series": series})
    )
    # One transaction, one more statement than a plain append: the record's upsert (its
    # current version and data come with the header read).
    assert statements == [
        "BEGIN IMMEDIATE",
        "UPDATE sessions SET",
        "SELECT s.next_index, s.expires_at_us,",
        "INSERT INTO turns",
        "INSERT INTO sessions",
        # A new header: migration 5's insert trigger (its WHEN is false here) is
        # traced with the text of the statement that fired it.
        "INSERT INTO sessions",
        "INSERT INTO session_records",
        "COMMIT",
    ]
    assert durable._db.transactions == transactions + 1
    statements.clear()
    series = ActiveEntity(kind="series", value="Guts", updated_at=clock.now())
    await durable.append_turns(
        "s-1", [text_turn("Guts")], entities=EntityChange(upsert={"series": series})
    )
    assert statements == [
        "BEGIN IMMEDIATE",
        "UPDATE sessions SET",
        "SELECT s.next_index, s.expires_at_us,",  # the header, with the record
        "INSERT INTO turns",
        "INSERT INTO session_records",
        "COMMIT",
    ]
    statements.clear()
    await durable.append_turns("s-1", [text_turn("ok")], entities=EntityChange())
    assert "INSERT INTO session_records" not in statements  # an empty change writes nothing
    record = await durable.get_record("s-1", ENTITIES_RECORD)
    assert record is not None
    assert (record.version, record.data) == (2, {"series": series.model_dump(mode="json")})


# -- group commit ---------------------------------------------------------------------------


async def hold_writer(store: SQLiteDurableStore) -> tuple[threading.Event, asyncio.Task[None]]:
    """Keep the store's worker thread busy in a write until the event is set, so that the
    calls made meanwhile queue up and run as one batch."""
    release = threading.Event()
    started = threading.Event()

    def hold(conn: sqlite3.Connection) -> None:
        started.set()
        release.wait(10)

    task = asyncio.create_task(store._db.write(hold))
    await asyncio.to_thread(started.wait, 10)
    return release, task


async def run_as_one_batch(
    store: SQLiteDurableStore, calls: list[Coroutine[Any, Any, T]]
) -> list[T | BaseException]:
    """Run ``calls`` concurrently while the writer is held, then let it take them at once."""
    release, holder = await hold_writer(store)
    results = asyncio.gather(*calls, return_exceptions=True)
    for _ in range(100):  # each call queues before its first real await
        if store._db.queued == len(calls):
            break
        await asyncio.sleep(0)
    assert store._db.queued == len(calls)
    release.set()
    await holder
    return await results


async def test_concurrent_appends_of_many_sessions_commit_together(
    durable: SQLiteDurableStore,
) -> None:
    sessions = [f"s-{i}" for i in range(20)]
    await durable.append_turns("warm-up", [text_turn("x")])
    before = durable._db.transactions
    stored = await run_as_one_batch(
        durable, [durable.append_turns(sid, [text_turn(f"{sid} a")]) for sid in sessions]
    )
    # The holder's transaction and one for the 20 appends.
    assert durable._db.transactions == before + 2
    assert [[t.index for t in turns] for turns in stored if isinstance(turns, list)] == [[0]] * 20
    for sid in sessions:
        assert [t.text for t in await durable.get_turns(sid)] == [f"{sid} a"]


async def test_a_failed_append_in_a_batch_fails_only_its_own_caller(
    durable: SQLiteDurableStore, db_path: Path
) -> None:
    sessions = [f"s-{i}" for i in range(12)]
    for sid in sessions:
        await durable.append_turns(sid, [text_turn(f"{sid} a")])
    # s-4's second turn fails after its first is written: its savepoint must undo that.
    install_failure(db_path, "turns", "INSERT", "NEW.session_id = 's-4' AND NEW.idx = 2")
    before = durable._db.transactions

    def append(sid: str) -> Coroutine[Any, Any, list[Turn]]:
        if sid == "s-7":  # a stale index: a conflict
            return durable.append_turns(sid, [text_turn("late")], first_index=0)
        return durable.append_turns(sid, [text_turn(f"{sid} b"), text_turn(f"{sid} c")])

    results = await run_as_one_batch(durable, [append(sid) for sid in sessions])
    # The holder's, the batch's first run (without savepoints: rolled back when s-4 or
    # s-7 raised) and its run again with a savepoint per write.
    assert durable._db.transactions == before + 3
    outcome = dict(zip(sessions, results, strict=True))
    conflict = outcome.pop("s-7")
    assert isinstance(conflict, ConflictError)
    assert (conflict.expected, conflict.actual) == (0, 1)
    failed = outcome.pop("s-4")
    assert isinstance(failed, BackendError)
    assert "injected failure" in str(failed)
    for sid, turns in outcome.items():
        assert isinstance(turns, list), sid
        assert [t.index for t in turns] == [1, 2]
        assert [t.text for t in await durable.get_turns(sid)] == [f"{sid} {x}" for x in "abc"]
    for sid in ("s-4", "s-7"):
        assert await durable.next_index(sid) == 1
        assert [t.text for t in await durable.get_turns(sid)] == [f"{sid} a"]


async def test_a_batch_whose_commit_fails_runs_its_writes_again_one_by_one(
    durable: SQLiteDurableStore, db_path: Path
) -> None:
    # A deferred foreign key is checked at COMMIT only: s-3's append breaks it, so the
    # batch's COMMIT fails. A real SQLite failure, no fake.
    await durable.append_turns("warm-up", [text_turn("x")])  # creates the tables
    with raw(db_path) as conn:
        conn.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        conn.execute(
            "CREATE TABLE child (parent_id INTEGER "
            "REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)"
        )
        conn.execute(
            "CREATE TRIGGER poison AFTER INSERT ON turns WHEN NEW.session_id = 's-3' "
            "BEGIN INSERT INTO child VALUES (42); END"
        )

    def enforce_foreign_keys(conn: sqlite3.Connection) -> None:
        conn.execute("COMMIT")  # the pragma is ignored inside a transaction
        conn.execute("PRAGMA foreign_keys = ON")

    await durable._db.read(enforce_foreign_keys)
    sessions = [f"s-{i}" for i in range(6)]
    before = durable._db.transactions
    results = await run_as_one_batch(
        durable, [durable.append_turns(sid, [text_turn(sid)]) for sid in sessions]
    )
    # The holder, the failed batch, then each of the 6 alone.
    assert durable._db.transactions == before + 2 + 6
    outcome = dict(zip(sessions, results, strict=True))
    failed = outcome.pop("s-3")
    assert isinstance(failed, BackendError)
    assert "FOREIGN KEY" in str(failed)
    assert await durable.next_index("s-3") == 0
    for sid, turns in outcome.items():
        assert isinstance(turns, list), sid
        assert [t.text for t in await durable.get_turns(sid)] == [sid]


async def test_a_read_in_a_batch_sees_exactly_the_writes_queued_before_it(
    durable: SQLiteDurableStore,
) -> None:
    await durable.append_turns("s-1", [text_turn("a")])
    results = await run_as_one_batch(
        durable,
        [
            durable.next_index("s-1"),
            durable.append_turns("s-1", [text_turn("b")]),
            durable.get_turns("s-1"),
            durable.append_turns("s-1", [text_turn("c")]),
            durable.next_index("s-1"),
        ],
    )
    before, appended_b, turns, appended_c, after = results
    assert isinstance(appended_b, list)
    assert isinstance(appended_c, list)
    assert [t.index for t in appended_b + appended_c] == [1, 2]
    assert before == 1  # queued ahead of both writes
    assert isinstance(turns, list)
    # Queued after "b": it sees "b" (and "c", committed in the same transaction).
    assert [t.text for t in turns] == ["a", "b", "c"]
    assert after == 3


async def test_a_call_cancelled_before_its_batch_runs_is_skipped(
    durable: SQLiteDurableStore,
) -> None:
    release, holder = await hold_writer(durable)
    cancelled = asyncio.create_task(durable.append_turns("s-1", [text_turn("never")]))
    kept = asyncio.create_task(durable.append_turns("s-2", [text_turn("kept")]))
    for _ in range(100):
        if durable._db.queued == 2:
            break
        await asyncio.sleep(0)
    cancelled.cancel()
    release.set()
    await holder
    assert [t.index for t in await kept] == [0]
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert await durable.next_index("s-1") == 0


# -- one connection per file ---------------------------------------------------------------


def turn_doc(clock: FakeClock, doc_id: str, text: str) -> IndexedDoc:
    return IndexedDoc(user_id="u-1", doc_id=doc_id, kind="turn", text=text, created_at=clock.now())


async def test_an_append_and_an_index_write_queued_together_commit_as_one(
    db_path: Path, clock: FakeClock
) -> None:
    durable = SQLiteDurableStore(db_path, clock=clock)
    index = SQLiteIndex(db_path, clock=clock)
    try:
        await durable.append_turns("s-1", [text_turn("first")])
        await index.upsert([turn_doc(clock, "s-1#0", "first")])  # its migrations ran
        before = durable._db.transactions
        appended, _ = await run_as_one_batch(
            durable,
            [
                durable.append_turns("s-1", [text_turn("second about berserk")]),
                index.upsert([turn_doc(clock, "s-1#1", "second about berserk")]),
            ],
        )
        # The holder's transaction and one for the append and the index write together:
        # the index queues on the durable store's connection.
        assert durable._db.transactions == index._db.transactions == before + 2
        assert isinstance(appended, list)
        assert [t.index for t in appended] == [1]
        hits = await index.search("u-1", "berserk", kinds=["turn"], limit=5)
        assert [h.doc_id for h in hits] == ["s-1#1"]
    finally:
        await index.aclose()
        await durable.aclose()


async def test_a_lone_append_runs_directly_and_is_committed_when_it_returns(
    durable: SQLiteDurableStore, db_path: Path
) -> None:
    await durable.append_turns("s-1", [text_turn("a")])  # the thread opens the file
    engine = durable._db._engine
    direct, transactions = engine._direct_commits, durable._db.transactions
    [turn] = await durable.append_turns("s-1", [text_turn("b")])
    assert engine._direct_commits == direct + 1  # on this thread, not the worker's
    assert durable._db.transactions == transactions + 1
    with raw(db_path) as conn:  # another connection sees it: committed
        assert conn.execute(
            "SELECT count(*) FROM turns WHERE session_id = 's-1' AND idx = ?", (turn.index,)
        ).fetchone() == (1,)


async def test_appends_of_many_sessions_arriving_together_share_commits(
    durable: SQLiteDurableStore,
) -> None:
    await durable.append_turns("warm-up", [text_turn("x")])
    before = durable._db.transactions
    sessions = [f"s-{i}" for i in range(20)]
    stored = await asyncio.gather(
        *(durable.append_turns(sid, [text_turn(sid)]) for sid in sessions)
    )
    assert [[t.index for t in turns] for turns in stored] == [[0]] * 20
    # They came together, so they went to the thread and its group commit (the first
    # alone may run directly): far fewer transactions than appends.
    assert durable._db.transactions - before < 10


async def test_turns_read_again_come_from_the_cache_until_their_payload_changes(
    durable: SQLiteDurableStore,
) -> None:
    await durable.append_turns("s-1", [text_turn("secret plan"), text_turn("b")])
    first = await durable.get_turns("s-1")
    again = await durable.get_turns("s-1")
    assert [a is b for a, b in zip(first, again, strict=True)] == [True, True]  # not decoded
    await durable.redact_turn("s-1", 0)
    [redacted, kept] = await durable.get_turns("s-1")
    assert redacted.redacted
    assert "secret" not in redacted.text
    assert kept is first[1]
    assert (await durable.get_turn("s-1", 0)).redacted
    await durable.delete_session("s-1")
    assert await durable.get_turns("s-1") == []


async def test_the_index_rewrites_a_document_with_the_same_terms_in_place(
    db_path: Path, clock: FakeClock
) -> None:
    index = SQLiteIndex(db_path, clock=clock, cache_users=0)  # every search reads the file
    try:
        first = turn_doc(clock, "s-1#0", "berserk volume 42")
        await index.upsert([first, turn_doc(clock, "s-1#1", "other words")])
        rowid = await index._db.read(row_id_of("s-1#0"))
        # Same text, new kind, dates and vector: the full-text row stays, the rest changes.
        later = first.model_copy(
            update={
                "kind": "chunk",
                "created_at": clock.now() + HOUR,
                "expires_at": clock.now() + 2 * HOUR,
                "embedding": (1.0, 0.0),
            }
        )
        await index.upsert([later])
        assert await index._db.read(row_id_of("s-1#0")) == rowid
        hits = await index.search("u-1", "berserk", kinds=["chunk"], limit=5)
        assert [h.doc_id for h in hits] == ["s-1#0"]
        assert await index.search("u-1", "berserk", kinds=["turn"], limit=5) == []
        vector_hits = await index.vector_search("u-1", (1.0, 0.0), kinds=["chunk"], limit=5)
        assert [h.doc_id for h in vector_hits] == ["s-1#0"]
        clock.advance(3 * HOUR)  # past the new expiry
        assert await index.search("u-1", "berserk", kinds=["chunk"], limit=5) == []
        # New terms: the old ones are gone from the full-text index.
        await index.upsert([turn_doc(clock, "s-1#1", "griffith")])
        assert await index.search("u-1", "other", kinds=["turn"], limit=5) == []
        hits = await index.search("u-1", "griffith", kinds=["turn"], limit=5)
        assert [h.doc_id for h in hits] == ["s-1#1"]
    finally:
        await index.aclose()


def row_id_of(doc_id: str) -> Callable[[sqlite3.Connection], int]:
    def op(conn: sqlite3.Connection) -> int:
        (rowid,) = conn.execute("SELECT id FROM recall_docs WHERE doc_id = ?", (doc_id,)).fetchone()
        return int(rowid)

    return op


async def test_the_index_setup_failing_fails_the_index_only(
    db_path: Path, clock: FakeClock
) -> None:
    index = SQLiteIndex(db_path, clock=clock)
    await index.upsert([turn_doc(clock, "s-1#0", "x")])
    await index.aclose()
    with raw(db_path) as conn:
        conn.execute(
            "UPDATE schema_versions SET version = 99 WHERE component = ?", (INDEX_COMPONENT,)
        )
    durable = SQLiteDurableStore(db_path, clock=clock)
    newer = SQLiteIndex(db_path, clock=clock)
    try:
        appended, failed = await asyncio.gather(
            durable.append_turns("s-1", [text_turn("a")]),
            newer.upsert([turn_doc(clock, "s-1#0", "a")]),
            return_exceptions=True,
        )
        assert isinstance(failed, BackendError)
        assert "recall index schema version 99" in str(failed)
        assert isinstance(appended, list)
        with pytest.raises(BackendError, match="schema version 99"):  # tried again, not cached
            await newer.search("u-1", "a", kinds=["turn"], limit=5)
        assert [t.text for t in await durable.get_turns("s-1")] == ["a"]
    finally:
        await newer.aclose()
        await durable.aclose()


async def test_a_store_closing_leaves_the_others_on_the_file_working(
    db_path: Path, clock: FakeClock
) -> None:
    durable = SQLiteDurableStore(db_path, clock=clock)
    index = SQLiteIndex(db_path, clock=clock)
    hot = SQLiteHotStore(db_path, clock=clock)
    try:
        await index.upsert([turn_doc(clock, "s-1#0", "berserk")])
        await hot.aclose()
        await index.aclose()
        with pytest.raises(BackendUnavailableError, match="closed"):
            await index.search("u-1", "berserk", kinds=["turn"], limit=5)
        assert [t.index for t in await durable.append_turns("s-1", [text_turn("a")])] == [0]
    finally:
        await durable.aclose()
    reopened = SQLiteIndex(db_path, clock=clock)
    try:
        hits = await reopened.search("u-1", "berserk", kinds=["turn"], limit=5)
        assert [h.doc_id for h in hits] == ["s-1#0"]
    finally:
        await reopened.aclose()


_ACKNOWLEDGING_WRITER = """
import asyncio, sys
from tiermem.store.backends.sqlite import SQLiteDurableStore
from tiermem.testing.backend import text_turn

async def main(path):
    store = SQLiteDurableStore(path)

    async def writer(w):
        for i in range(10_000):
            [turn] = await store.append_turns(f"s-{w}", [text_turn(f"w{w} t{i}")])
            print(f"s-{w} {turn.index} w{w} t{i}", flush=True)  # acknowledged

    await asyncio.gather(*(writer(w) for w in range(20)))

asyncio.run(main(sys.argv[1]))
"""


def test_every_acknowledged_append_survives_kill_9(db_path: Path) -> None:
    # 20 sessions append at once (group commits) and print each append as it returns;
    # SIGKILL lands mid-stream. Whatever was printed must be in the file.
    proc = subprocess.Popen(  # noqa: S603 -- this interpreter, our own script
        [sys.executable, "-c", _ACKNOWLEDGING_WRITER, str(db_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    acknowledged: list[str] = []
    try:
        for line in proc.stdout:
            acknowledged.append(line)
            if len(acknowledged) >= 400:
                break
    finally:
        proc.kill()  # SIGKILL: no cleanup, no final commit
        acknowledged.extend(proc.stdout.read().splitlines())
        proc.wait()
    assert len(acknowledged) >= 400, "the writer stopped early"
    with raw(db_path) as conn:
        stored = {
            (session_id, index): payload
            for session_id, index, payload in conn.execute(
                "SELECT session_id, idx, payload FROM turns"
            )
        }
        heads = dict(conn.execute("SELECT session_id, next_index FROM sessions"))
    for line in acknowledged:
        session_id, index, text = line.strip().split(" ", 2)
        assert text in stored[(session_id, int(index))], line
    for session_id, next_index in heads.items():  # gap-free, whatever was cut off
        indexes = sorted(i for s, i in stored if s == session_id)
        assert indexes == list(range(next_index)), session_id


# -- durability setting -------------------------------------------------------------------


async def test_synchronous_is_normal_by_default_and_full_on_request(db_path: Path) -> None:
    def mode(conn: sqlite3.Connection) -> int:
        return int(conn.execute("PRAGMA synchronous").fetchone()[0])

    default = SQLiteDurableStore(db_path)
    full = SQLiteHotStore(db_path, synchronous="FULL")
    try:
        assert await default._db.read(mode) == 1  # NORMAL
        assert await full._db.read(mode) == 2  # FULL
    finally:
        await default.aclose()
        await full.aclose()
    with pytest.raises(ValidationError, match="NORMAL"):
        SQLiteDurableStore(db_path, synchronous="OFF")  # type: ignore[arg-type]


def test_the_synchronous_setting_reaches_both_sqlite_stores(tmp_path: Path) -> None:
    settings = TierMemSettings(
        hot_backend="sqlite",
        durable_backend="sqlite",
        sqlite_path=tmp_path / "t.db",
        sqlite_synchronous="FULL",
    )
    hot, durable = open_hot_store(settings), open_durable_store(settings)
    assert isinstance(hot, SQLiteHotStore)
    assert isinstance(durable, SQLiteDurableStore)
    assert hot._db.synchronous == durable._db.synchronous == "FULL"
    assert TierMemSettings().sqlite_synchronous == "NORMAL"


# -- hot: entities, restore ---------------------------------------------------------------


async def test_entities_on_an_absent_session_leave_no_activity_entry(
    hot: SQLiteHotStore, clock: FakeClock, db_path: Path
) -> None:
    entity = ActiveEntity(kind="series", value="Berserk", updated_at=clock.now())
    assert (
        await hot.update_entities("s-1", {"series": entity}, expires_at=clock.now() + HOUR) is None
    )
    assert [count_rows(db_path, t, "s-1") for t in ("hot_sessions", "activity")] == [0, 0]
    clock.advance(2 * HOUR)
    assert await hot.claim_expired(owner="w", lease=timedelta(minutes=1)) == []


def metadata(clock: FakeClock, session_id: str) -> SessionMetadata:
    return SessionMetadata(
        session_id=session_id, user_id="u-1", created_at=clock.now(), last_activity=clock.now()
    )


async def test_a_failed_restore_leaves_the_session_as_it_was(
    hot: SQLiteHotStore, clock: FakeClock, db_path: Path
) -> None:
    before = await hot.append_turns(
        "s-1", [text_turn("a")], window=5, expires_at=clock.now() + HOUR
    )
    install_failure(db_path, "hot_state", "INSERT", "1")
    blob = StateBlob(name="dialogue", data={"phase": "x"}, version=4, updated_at=clock.now())
    with pytest.raises(BackendError, match="injected failure"):
        # The old rows are deleted and the new session row written before the state fails.
        await hot.restore(
            "s-1",
            turns=[],
            next_index=7,
            metadata=metadata(clock, "s-1"),
            entities={},
            state={"dialogue": blob},
            window=5,
            expires_at=clock.now() + 2 * HOUR,
        )
    snap = await hot.load("s-1")
    assert snap is not None
    assert (snap.turns, snap.version, snap.next_index) == (before.turns, 1, 1)
    assert snap.metadata is None


async def test_restore_is_a_write_for_the_activity_index(
    hot: SQLiteHotStore, clock: FakeClock
) -> None:
    await hot.append_turns("s-1", [text_turn("a")], window=5, expires_at=clock.now() + HOUR)
    clock.advance(HOUR)
    assert await hot.claim_expired(owner="w-1", lease=timedelta(minutes=1)) == ["s-1"]
    await hot.restore(
        "s-1",
        turns=[],
        next_index=1,
        metadata=metadata(clock, "s-1"),
        entities={},
        state={},
        window=5,
        expires_at=clock.now() + HOUR,
    )
    # The write cleared the lease, and the entry carries the new expiry.
    assert await hot.release_expired("s-1", owner="w-1") is False
    assert await hot.claim_expired(owner="w-2", lease=timedelta(minutes=1)) == []
    clock.advance(HOUR)
    assert await hot.claim_expired(owner="w-2", lease=timedelta(minutes=1)) == ["s-1"]


# -- default location ---------------------------------------------------------------------


def test_default_data_dir_honours_xdg_data_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.platform", "linux")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_data_dir() == tmp_path / "xdg" / "tiermem"
    assert (tmp_path / "xdg" / "tiermem").is_dir()
    assert default_database_path() == tmp_path / "xdg" / "tiermem" / "tiermem.db"


@pytest.mark.parametrize(
    ("platform", "environ", "expected"),
    [
        ("linux", {}, "/home/alice/.local/share/tiermem"),
        ("linux", {"XDG_DATA_HOME": "relative/dir"}, "/home/alice/.local/share/tiermem"),
        ("linux", {"XDG_DATA_HOME": "/data/alice"}, "/data/alice/tiermem"),
        (
            "darwin",
            {"XDG_DATA_HOME": "/ignored"},
            "/home/alice/Library/Application Support/tiermem",
        ),
        (
            "win32",
            {"LOCALAPPDATA": r"C:\Users\alice\AppData\Local"},
            r"C:\Users\alice\AppData\Local\tiermem",
        ),
    ],
)
def test_data_dir_is_per_user_and_never_temporary(
    platform: str, environ: dict[str, str], expected: str
) -> None:
    directory = data_dir_for(platform, environ, PurePosixPath("/home/alice"))
    assert str(directory) == expected
    assert not str(directory).startswith((tempfile.gettempdir(), "/tmp", "/var/tmp"))  # noqa: S108 -- asserting we avoid them
