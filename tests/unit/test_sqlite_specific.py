"""What the SQLite backend promises beyond the shared contract (tests/conformance covers that):
migrations (including dropping the old ``memories_fts``), persistence across instances, the
default path, atomicity of failed writes, lock errors, and physical collection of expired
rows."""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath

import pytest

from tiermem.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ValidationError,
)
from tiermem.models import MemoryRecord, SessionRef
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
from tiermem.store.contract import Capability, DurableStore, HotStore
from tiermem.testing import FakeClock
from tiermem.testing.backend import text_turn

HOUR = timedelta(hours=1)


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


@contextmanager
def raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A separate connection to the file, as another process would have."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        yield conn


def memory(
    clock: FakeClock, user_id: str, memory_id: str, content: str, **extra: object
) -> MemoryRecord:
    return MemoryRecord.model_validate(
        {"memory_id": memory_id, "user_id": user_id, "memory_type": "preference",
         "content": content, "created_at": clock.now(), **extra}
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


async def test_stores_opening_a_new_file_at_once_migrate_it_once(db_path: Path) -> None:
    stores = [SQLiteHotStore(db_path) for _ in range(4)] + [
        SQLiteDurableStore(db_path) for _ in range(4)
    ]
    try:
        # Each store opens (and would migrate) on its own thread, all at the same time.
        await asyncio.gather(*(
            s.load("s-1") if isinstance(s, SQLiteHotStore) else s.next_index("s-1")
            for s in stores
        ))
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
    await hot.append_turns("s-1", [text_turn("こんにちは")], window=5,
                           expires_at=clock.now() + HOUR)
    await hot.put_state("s-1", "dialogue", {"phase": "greeting"}, expires_at=clock.now() + HOUR)
    await durable.append_turns("s-1", [text_turn("a"), text_turn("b")])
    await durable.put_record("s-1", "summary", {"text": "greeted"})
    await durable.register_session(SessionRef(session_id="s-1", user_id="u-1",
                                              created_at=clock.now()))
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
    before = await hot.append_turns("s-1", [text_turn("a"), text_turn("b")], window=10,
                                    expires_at=clock.now() + HOUR)
    install_failure(db_path, "hot_turns", "INSERT", "NEW.idx = 3")
    with pytest.raises(BackendError, match="injected failure"):
        # Turn 2 is written and the session row updated before turn 3 fails.
        await hot.append_turns("s-1", [text_turn("c"), text_turn("d")], window=10,
                               expires_at=clock.now() + 2 * HOUR)
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
    await durable.register_session(SessionRef(session_id="s-1", user_id="u-1",
                                              created_at=clock.now()))
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
    stores = [SQLiteDurableStore(db_path, clock=clock) for _ in range(2)]

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
        await durable.put_memory(memory(clock, "u-1", f"m-{i}", f"c{i}",
                                        created_at=base.replace(microsecond=micro)))
    newest_first = await durable.query_memories("u-1")
    assert [r.memory_id for r in newest_first] == ["m-1", "m-2", "m-0"]
    since = await durable.query_memories("u-1", since=base.replace(microsecond=500))
    assert [r.memory_id for r in since] == ["m-1", "m-2"]


def count_rows(path: Path, table: str, session_id: str) -> int:
    with raw(path) as conn:
        return int(conn.execute(
            f"SELECT count(*) FROM {table} WHERE session_id = ?",  # noqa: S608 -- test constant
            (session_id,),
        ).fetchone()[0])


async def test_long_expired_hot_sessions_are_collected_but_stay_claimable(
    db_path: Path, clock: FakeClock
) -> None:
    hot = SQLiteHotStore(db_path, clock=clock, gc_grace=timedelta(minutes=10))
    try:
        await hot.append_turns("old", [text_turn("a")], window=5, expires_at=clock.now() + HOUR)
        clock.advance(HOUR + timedelta(minutes=5))
        for _ in range(64):  # within the grace: nothing collected yet
            await hot.touch("nobody", expires_at=clock.now() + HOUR)
            await hot.append_turns("busy", [text_turn("x")], window=1,
                                   expires_at=clock.now() + HOUR)
        assert count_rows(db_path, "hot_turns", "old") == 1
        clock.advance(timedelta(minutes=6))
        for _ in range(64):
            await hot.append_turns("busy", [text_turn("x")], window=1,
                                   expires_at=clock.now() + HOUR)
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
        ("darwin", {"XDG_DATA_HOME": "/ignored"},
         "/home/alice/Library/Application Support/tiermem"),
        ("win32", {"LOCALAPPDATA": r"C:\Users\alice\AppData\Local"},
         r"C:\Users\alice\AppData\Local\tiermem"),
    ],
)
def test_data_dir_is_per_user_and_never_temporary(
    platform: str, environ: dict[str, str], expected: str
) -> None:
    directory = data_dir_for(platform, environ, PurePosixPath("/home/alice"))
    assert str(directory) == expected
    assert not str(directory).startswith((tempfile.gettempdir(), "/tmp", "/var/tmp"))  # noqa: S108 -- asserting we avoid them
