"""Statements the SQLite durable store spares (issue #8, session 17), with what it stores
unchanged:

* a conditional ``put_memory`` writes with its condition in the write (one statement, no
  read first); only a conflict reads the stored version, for the error;
* a small read of one statement runs without ``BEGIN``/``COMMIT`` around it;
* a session record's JSON comes from its serializer directly (the same bytes as
  ``model_dump_json``).

The conditional writes are compared with a copy of the code before on generated
sequences of writes, expiries and clock moves: the same outcomes, errors and rows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_core import PydanticSerializationError

from tests.unit._sqlite_helpers import traced
from tiermem.clock import FakeClock
from tiermem.errors import ConflictError
from tiermem.models import MemoryRecord, SessionRecord
from tiermem.store.backends.sqlite import SQLiteDurableStore
from tiermem.store.backends.sqlite._durable import _RECORD_TO_JSON, _is_live
from tiermem.store.backends.sqlite._mapping import to_epoch_us
from tiermem.store.codec import check_memory_version, encode_memory


class RefStore(SQLiteDurableStore):
    """The durable store with ``put_memory`` as it was: read the version, then write."""

    async def put_memory(
        self, record: MemoryRecord, *, expected_version: int | None = None
    ) -> MemoryRecord:
        payload = encode_memory(record)
        check_memory_version(record, expected_version)
        created_at_us = to_epoch_us(record.created_at)
        expires_at_us = None if record.expires_at is None else to_epoch_us(record.expires_at)

        def op(conn: sqlite3.Connection) -> MemoryRecord:
            row = conn.execute(
                "SELECT version, expires_at_us FROM memories WHERE user_id = ? AND memory_id = ?",
                (record.user_id, record.memory_id),
            ).fetchone()
            actual = int(row[0]) if row and _is_live(row[1], self._now_us()) else 0
            if expected_version is not None and expected_version != actual:
                raise ConflictError(
                    f"memory {record.memory_id!r} is at version {actual}, "
                    f"not {expected_version}; re-read it and retry",
                    expected=expected_version,
                    actual=actual,
                )
            conn.execute(
                "INSERT INTO memories (user_id, memory_id, memory_type, created_at_us, "
                "expires_at_us, version, payload) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (user_id, memory_id) DO UPDATE SET "
                "memory_type = excluded.memory_type, created_at_us = excluded.created_at_us, "
                "expires_at_us = excluded.expires_at_us, version = excluded.version, "
                "payload = excluded.payload",
                (
                    record.user_id,
                    record.memory_id,
                    record.memory_type,
                    created_at_us,
                    expires_at_us,
                    record.version,
                    payload,
                ),
            )
            return record

        return await self._db.write(op, direct=self._db.alone(record.user_id))


START = datetime(2030, 1, 1, tzinfo=UTC)

# One write: memory id, which version it expects (None: none; "held": the stored live
# version; else that number), its lifetime from now (None: forever), minutes the clock
# moves first.
_WRITES = st.lists(
    st.tuples(
        st.sampled_from(["m-1", "m-2"]),
        st.none() | st.just("held") | st.integers(min_value=-1, max_value=4),
        st.none() | st.integers(min_value=-5, max_value=30),
        st.integers(min_value=0, max_value=20),
    ),
    min_size=1,
    max_size=14,
)


def _rows(path: Path) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT * FROM memories ORDER BY user_id, memory_id").fetchall()


async def _apply(
    store: SQLiteDurableStore, clock: FakeClock, writes: list[Any]
) -> list[tuple[Any, ...]]:
    outcomes: list[tuple[Any, ...]] = []
    for memory_id, expected, lifetime, minutes in writes:
        clock.advance(timedelta(minutes=minutes))
        now = clock.now()
        held = await store.get_memory("u-1", memory_id)
        if expected == "held":
            expected = held.version if held is not None else 0
        version = max(1, (expected or 0) + 1) if expected is not None else 7
        record = MemoryRecord(
            memory_id=memory_id,
            user_id="u-1",
            memory_type="fact",
            content=f"written at {now.isoformat()}",
            created_at=now,
            expires_at=None if lifetime is None else now + timedelta(minutes=lifetime),
            version=version,
        )
        try:
            stored = await store.put_memory(record, expected_version=expected)
        except ConflictError as exc:
            outcomes.append(("conflict", exc.expected, exc.actual, str(exc)))
        except Exception as exc:  # noqa: BLE001 -- the error is the outcome compared
            outcomes.append((type(exc).__name__, str(exc)))
        else:
            outcomes.append(("ok", stored.version))
    return outcomes


@settings(max_examples=60, deadline=None)
@given(_WRITES)
def test_conditional_memory_writes_do_what_they_did(tmp_path_factory: Any, writes: Any) -> None:
    import asyncio

    async def run() -> None:
        base = tmp_path_factory.mktemp("mem")
        results = []
        for cls in (SQLiteDurableStore, RefStore):
            clock = FakeClock(START)
            path = base / f"{cls.__name__}.db"
            store = cls(path, clock=clock)
            try:
                outcomes = await _apply(store, clock, writes)
            finally:
                await store.aclose()
            results.append((outcomes, _rows(path)))
        assert results[0] == results[1]

    asyncio.run(run())


@pytest.fixture
async def durable(tmp_path: Path) -> AsyncIterator[SQLiteDurableStore]:
    store = SQLiteDurableStore(tmp_path / "t.db", clock=FakeClock(START))
    yield store
    await store.aclose()


def _memory(version: int, content: str = "tea") -> MemoryRecord:
    return MemoryRecord(
        memory_id="pref-1",
        user_id="u-1",
        memory_type="preference",
        content=content,
        created_at=START,
        version=version,
    )


async def test_a_conditional_memory_write_is_one_statement(durable: SQLiteDurableStore) -> None:
    await durable.put_memory(_memory(1, "warm-up"))  # opens the file; the collector's turn
    await durable.delete_memory("u-1", "pref-1")
    statements = await traced(durable)
    await durable.put_memory(_memory(1), expected_version=0)
    assert statements == ["BEGIN IMMEDIATE", "INSERT INTO memories", "COMMIT"]
    statements.clear()
    await durable.put_memory(_memory(2, "coffee"), expected_version=1)
    assert statements == ["BEGIN IMMEDIATE", "UPDATE memories SET", "COMMIT"]
    statements.clear()
    with pytest.raises(ConflictError) as raised:
        await durable.put_memory(_memory(2, "juice"), expected_version=1)
    assert (raised.value.expected, raised.value.actual) == (1, 2)
    # Only a conflict reads the version, for its error; nothing was written.
    assert statements == [
        "BEGIN IMMEDIATE",
        "UPDATE memories SET",
        "SELECT version, expires_at_us",
        "ROLLBACK",
    ]
    stored = await durable.get_memory("u-1", "pref-1")
    assert stored is not None
    assert (stored.version, stored.content) == (2, "coffee")


async def test_a_small_read_of_one_statement_runs_alone(durable: SQLiteDurableStore) -> None:
    await durable.put_memory(_memory(1))
    statements = await traced(durable)
    found = await durable.get_memory("u-1", "pref-1")
    assert found is not None
    assert found.content == "tea"
    assert statements == ["SELECT payload FROM"]  # no BEGIN and COMMIT around it
    statements.clear()
    assert await durable.next_index("s-1") == 0
    assert await durable.get_record("s-1", "entities") is None
    assert await durable.get_session("s-1") is None
    assert statements == [
        "SELECT next_index FROM",
        "SELECT r.payload, s.expires_at_us",
        "SELECT ref FROM",
    ]


_TEXT = st.text(
    st.characters(codec="utf-8") | st.sampled_from('\x00\x1f\x7f\u2028"\\漫画😀'), max_size=20
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=10,
)
_WHEN = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(_TEXT, _JSON, max_size=4),
    st.integers(min_value=1, max_value=10**6),
    _WHEN,
    st.none() | _WHEN,
)
def test_a_session_record_is_written_as_model_dump_json(
    data: dict[str, Any], version: int, updated: datetime, expires: datetime | None
) -> None:
    record = SessionRecord(
        kind="entities", data=data, version=version, updated_at=updated, expires_at=expires
    )
    try:
        expected = record.model_dump_json()
    except PydanticSerializationError:
        with pytest.raises(PydanticSerializationError):
            _RECORD_TO_JSON(record)
        return
    assert _RECORD_TO_JSON(record).decode() == expected
