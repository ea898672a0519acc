"""The durable tier in SQLite: :class:`SQLiteDurableStore`.

The turn archive is ``turns`` plus ``archive_heads`` (each session's next index, kept apart
so that collecting expired turns never frees a slot for reuse); session records are
``session_records``; a user's sessions are ``user_sessions``; long-term memories are
``memories``. Searching memories is recall's job
(:class:`~tiermem.longterm.index_sqlite.SQLiteIndex`), not this store's.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta

from tiermem.clock import Clock, SystemClock
from tiermem.errors import ConflictError, NotFoundError, ValidationError
from tiermem.models import JsonValue, MemoryRecord, NewTurn, SessionRecord, SessionRef, Turn
from tiermem.store.backends.sqlite._connection import (
    DEFAULT_BUSY_TIMEOUT,
    SQLiteDatabase,
    to_epoch_us,
)
from tiermem.store.codec import (
    check_append,
    check_index,
    check_kind,
    check_memory_ids,
    check_memory_version,
    check_range,
    decode_memory,
    decode_turn,
    encode_data,
    encode_memory,
    encode_turn,
)
from tiermem.store.contract import Capability
from tiermem.store.keys import validate_id

__all__ = ["SQLiteDurableStore"]

_MAX_INDEX = 2**63 - 1
"""SQLite integers are 64-bit; larger indexes cannot exist, so queries clamp to this."""
_GC_EVERY_WRITES = 64
_GC_BATCH = 100
_IDS_PER_SELECT = 500
"""Ids bound in one ``IN (...)``: under SQLite's historical 999-parameter limit."""
# Logical expiry in SQL, as codec.is_live: "(expires_at_us IS NULL OR expires_at_us > ?)"
# with now in epoch microseconds; spelled out in each statement so statements stay literals.


def _is_live(expires_at_us: int | None, now_us: int) -> bool:
    return expires_at_us is None or now_us < expires_at_us


def _optional_us(value: datetime | None) -> int | None:
    return None if value is None else to_epoch_us(value, what="expires_at")


class SQLiteDurableStore:
    """Durable tier in a SQLite file. See :class:`tiermem.store.contract.DurableStore`.

    ``path`` must be a file (see :func:`default_database_path`); it may be the same file
    as a :class:`SQLiteHotStore`'s. Expired turns and records are deleted by later
    writes, a few at a time; expired memories are kept, since ``query_memories`` can still
    return them.

    Raises (every method):
        BackendTimeoutError: another connection held the write lock for ``busy_timeout``.
        BackendError: SQLite failed otherwise (full disk, corrupt file...).
    """

    name = "sqlite"
    capabilities = frozenset({Capability.PERSISTENT})

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        busy_timeout: timedelta = DEFAULT_BUSY_TIMEOUT,
    ) -> None:
        self._db = SQLiteDatabase(path, role="durable", busy_timeout=busy_timeout)
        self._clock = clock or SystemClock()
        self._writes = 0  # touched only on the database's worker thread

    def _now_us(self) -> int:
        return to_epoch_us(self._clock.now(), what="clock.now()")

    def _collect_garbage(self, conn: sqlite3.Connection, now_us: int) -> None:
        """Delete some logically expired turns and records, now and then (during a write)."""
        self._writes += 1
        if (self._writes - 1) % _GC_EVERY_WRITES:
            return
        conn.execute(
            "DELETE FROM turns WHERE rowid IN (SELECT rowid FROM turns "
            "WHERE expires_at_us <= ? LIMIT ?)",
            (now_us, _GC_BATCH),
        )
        conn.execute(
            "DELETE FROM session_records WHERE rowid IN (SELECT rowid FROM session_records "
            "WHERE expires_at_us <= ? LIMIT ?)",
            (now_us, _GC_BATCH),
        )

    # -- turn archive -------------------------------------------------------------------

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[NewTurn],
        *,
        first_index: int | None = None,
        expires_at: datetime | None = None,
    ) -> list[Turn]:
        check_append(session_id, turns, first_index=first_index)
        expires_at_us = _optional_us(expires_at)

        def op(conn: sqlite3.Connection) -> list[Turn]:
            start = _next_index(conn, session_id)
            if first_index is not None and first_index != start:
                raise ConflictError(
                    f"session {session_id!r}: next archived turn index is {start}, "
                    f"not {first_index}",
                    expected=first_index,
                    actual=start,
                )
            indexed = [turn.with_index(start + i) for i, turn in enumerate(turns)]
            payloads = [encode_turn(turn) for turn in indexed]  # size check before writing
            conn.executemany(
                "INSERT INTO turns (session_id, idx, payload, expires_at_us) VALUES (?, ?, ?, ?)",
                [
                    (session_id, turn.index, payload, expires_at_us)
                    for turn, payload in zip(indexed, payloads, strict=True)
                ],
            )
            conn.execute(
                "INSERT INTO archive_heads (session_id, next_index) VALUES (?, ?) "
                "ON CONFLICT (session_id) DO UPDATE SET next_index = excluded.next_index",
                (session_id, start + len(indexed)),
            )
            self._collect_garbage(conn, self._now_us())
            return indexed

        return await self._db.write(op)

    async def next_index(self, session_id: str) -> int:
        validate_id(session_id, what="session_id")
        return await self._db.read(lambda conn: _next_index(conn, session_id))

    async def get_turn(self, session_id: str, index: int) -> Turn:
        validate_id(session_id, what="session_id")
        check_index(index)

        def op(conn: sqlite3.Connection) -> str | None:
            return _visible_turn(conn, session_id, index, self._now_us())

        payload = await self._db.read(op)
        if payload is None:
            raise NotFoundError(f"session {session_id!r} has no turn {index}")
        return decode_turn(payload)

    async def get_turns(
        self, session_id: str, start: int = 0, end: int | None = None
    ) -> list[Turn]:
        validate_id(session_id, what="session_id")
        check_range(start, end)
        stop = _MAX_INDEX if end is None else min(end, _MAX_INDEX)

        def op(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT payload FROM turns WHERE session_id = ? AND idx >= ? AND idx < ? "
                "AND (expires_at_us IS NULL OR expires_at_us > ?) ORDER BY idx",
                (session_id, min(start, _MAX_INDEX), stop, self._now_us()),
            )
            return [payload for (payload,) in rows]

        return [decode_turn(payload) for payload in await self._db.read(op)]

    async def tail_turns(self, session_id: str, count: int) -> list[Turn]:
        validate_id(session_id, what="session_id")
        if count < 0:
            raise ValidationError(f"count must be >= 0, got {count}")
        if count == 0:
            return []

        def op(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT payload FROM turns WHERE session_id = ? "
                "AND (expires_at_us IS NULL OR expires_at_us > ?) ORDER BY idx DESC LIMIT ?",
                (session_id, self._now_us(), min(count, _MAX_INDEX)),
            )
            return [payload for (payload,) in rows]

        return [decode_turn(payload) for payload in reversed(await self._db.read(op))]

    async def redact_turn(self, session_id: str, index: int) -> Turn:
        validate_id(session_id, what="session_id")
        check_index(index)

        def op(conn: sqlite3.Connection) -> Turn:
            payload = _visible_turn(conn, session_id, index, self._now_us())
            if payload is None:
                raise NotFoundError(f"session {session_id!r} has no turn {index}")
            redacted = decode_turn(payload).redact()
            conn.execute(
                "UPDATE turns SET payload = ? WHERE session_id = ? AND idx = ?",
                (encode_turn(redacted), session_id, index),
            )
            return redacted

        return await self._db.write(op)

    # -- sessions -----------------------------------------------------------------------

    async def register_session(self, ref: SessionRef) -> None:
        validate_id(ref.session_id, what="session_id")
        validate_id(ref.user_id, what="user_id")
        row = (ref.user_id, ref.session_id, to_epoch_us(ref.created_at), ref.model_dump_json())

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO user_sessions (user_id, session_id, created_at_us, payload) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (user_id, session_id) DO NOTHING",
                row,
            )

        await self._db.write(op)

    async def list_sessions(self, user_id: str, *, limit: int = 100) -> list[SessionRef]:
        validate_id(user_id, what="user_id")
        if limit < 0:
            raise ValidationError(f"limit must be >= 0, got {limit}")

        def op(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT payload FROM user_sessions WHERE user_id = ? "
                "ORDER BY created_at_us DESC, session_id DESC LIMIT ?",
                (user_id, min(limit, _MAX_INDEX)),
            )
            return [payload for (payload,) in rows]

        return [SessionRef.model_validate_json(p) for p in await self._db.read(op)]

    async def get_record(self, session_id: str, kind: str) -> SessionRecord | None:
        validate_id(session_id, what="session_id")
        check_kind(kind)

        def op(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT payload FROM session_records WHERE session_id = ? AND kind = ? "
                "AND (expires_at_us IS NULL OR expires_at_us > ?)",
                (session_id, kind, self._now_us()),
            ).fetchone()
            return None if row is None else str(row[0])

        payload = await self._db.read(op)
        return None if payload is None else SessionRecord.model_validate_json(payload)

    async def put_record(
        self,
        session_id: str,
        kind: str,
        data: Mapping[str, JsonValue],
        *,
        expected_version: int | None = None,
        expires_at: datetime | None = None,
    ) -> SessionRecord:
        validate_id(session_id, what="session_id")
        check_kind(kind)
        copy = json.loads(encode_data(data, what=f"record {kind!r}"))
        expires_at_us = _optional_us(expires_at)

        def op(conn: sqlite3.Connection) -> SessionRecord:
            now = self._clock.now()
            now_us = to_epoch_us(now, what="clock.now()")
            row = conn.execute(
                "SELECT version, expires_at_us FROM session_records "
                "WHERE session_id = ? AND kind = ?",
                (session_id, kind),
            ).fetchone()
            actual = int(row[0]) if row and _is_live(row[1], now_us) else 0
            if expected_version is not None and expected_version != actual:
                raise ConflictError(
                    f"record {kind!r} of session {session_id!r} is at version {actual}, "
                    f"not {expected_version}; re-read it and retry",
                    expected=expected_version,
                    actual=actual,
                )
            record = SessionRecord(
                kind=kind, data=copy, version=actual + 1, updated_at=now, expires_at=expires_at
            )
            conn.execute(
                "INSERT INTO session_records (session_id, kind, version, payload, expires_at_us) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_id, kind) DO UPDATE SET "
                "version = excluded.version, payload = excluded.payload, "
                "expires_at_us = excluded.expires_at_us",
                (session_id, kind, record.version, record.model_dump_json(), expires_at_us),
            )
            self._collect_garbage(conn, now_us)
            return record

        return await self._db.write(op)

    async def delete_session(self, session_id: str) -> None:
        validate_id(session_id, what="session_id")

        def op(conn: sqlite3.Connection) -> None:
            _delete_session(conn, session_id)
            conn.execute("DELETE FROM user_sessions WHERE session_id = ?", (session_id,))

        await self._db.write(op)

    # -- long-term memory -------------------------------------------------------------

    async def put_memory(
        self, record: MemoryRecord, *, expected_version: int | None = None
    ) -> MemoryRecord:
        payload = encode_memory(record)
        check_memory_version(record, expected_version)
        created_at_us = to_epoch_us(record.created_at)
        expires_at_us = _optional_us(record.expires_at)

        def op(conn: sqlite3.Connection) -> MemoryRecord:
            row = conn.execute(
                "SELECT version, expires_at_us FROM memories "
                "WHERE user_id = ? AND memory_id = ?",
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
                (record.user_id, record.memory_id, record.memory_type, created_at_us,
                 expires_at_us, record.version, payload),
            )
            return record

        return await self._db.write(op)

    async def get_memory(self, user_id: str, memory_id: str) -> MemoryRecord | None:
        validate_id(user_id, what="user_id")
        validate_id(memory_id, what="memory_id")

        def op(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT payload FROM memories WHERE user_id = ? AND memory_id = ? "
                "AND (expires_at_us IS NULL OR expires_at_us > ?)",
                (user_id, memory_id, self._now_us()),
            ).fetchone()
            return None if row is None else str(row[0])

        payload = await self._db.read(op)
        return None if payload is None else decode_memory(payload)

    async def get_memories(
        self, user_id: str, memory_ids: Collection[str]
    ) -> dict[str, MemoryRecord]:
        """One executor call: one ``SELECT ... IN (...)`` per 500 ids, in one transaction."""
        ids = check_memory_ids(user_id, memory_ids)
        if not ids:
            return {}

        def op(conn: sqlite3.Connection) -> list[tuple[str, str]]:
            now_us = self._now_us()
            rows: list[tuple[str, str]] = []
            for start in range(0, len(ids), _IDS_PER_SELECT):
                chunk = ids[start : start + _IDS_PER_SELECT]
                # Only placeholders are joined into the statement.
                placeholders = ", ".join("?" * len(chunk))
                rows += conn.execute(
                    "SELECT memory_id, payload FROM memories WHERE user_id = ? "  # noqa: S608
                    f"AND memory_id IN ({placeholders}) "
                    "AND (expires_at_us IS NULL OR expires_at_us > ?)",
                    (user_id, *chunk, now_us),
                ).fetchall()
            return rows

        rows = await self._db.read(op)
        return {memory_id: decode_memory(payload) for memory_id, payload in rows}

    async def query_memories(
        self,
        user_id: str,
        *,
        memory_types: Collection[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        include_expired: bool = False,
    ) -> list[MemoryRecord]:
        validate_id(user_id, what="user_id")
        if limit < 1:
            raise ValidationError(f"limit must be >= 1, got {limit}")
        if isinstance(memory_types, str):
            raise ValidationError(
                f"memory_types is a collection of types; wrap {memory_types!r} in a list"
            )
        clauses = ["user_id = ?"]
        params: list[object] = [user_id]
        if memory_types is not None:
            types = list(dict.fromkeys(memory_types))
            if not types:
                return []
            clauses.append(f"memory_type IN ({', '.join('?' * len(types))})")
            params.extend(types)
        if since is not None:
            clauses.append("created_at_us >= ?")
            params.append(to_epoch_us(since, what="since"))
        if until is not None:
            clauses.append("created_at_us < ?")
            params.append(to_epoch_us(until, what="until"))
        # Only placeholders and constant clauses are joined into the statement.
        where = " AND ".join(clauses)
        order = "ORDER BY created_at_us DESC, memory_id DESC LIMIT ?"

        def op(conn: sqlite3.Connection) -> list[str]:
            bound = list(params)
            condition = where
            if not include_expired:
                condition += " AND (expires_at_us IS NULL OR expires_at_us > ?)"
                bound.append(self._now_us())
            bound.append(min(limit, _MAX_INDEX))
            rows = conn.execute(
                f"SELECT payload FROM memories WHERE {condition} {order}",  # noqa: S608 -- see above
                bound,
            )
            return [payload for (payload,) in rows]

        return [decode_memory(payload) for payload in await self._db.read(op)]

    async def delete_memory(self, user_id: str, memory_id: str) -> bool:
        validate_id(user_id, what="user_id")
        validate_id(memory_id, what="memory_id")

        def op(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "DELETE FROM memories WHERE user_id = ? AND memory_id = ?",
                (user_id, memory_id),
            )
            return cursor.rowcount > 0

        return await self._db.write(op)

    async def purge_user(self, user_id: str) -> int:
        validate_id(user_id, what="user_id")

        def op(conn: sqlite3.Connection) -> int:
            sessions = [
                session_id
                for (session_id,) in conn.execute(
                    "SELECT session_id FROM user_sessions WHERE user_id = ?", (user_id,)
                ).fetchall()
            ]
            for session_id in sessions:
                _delete_session(conn, session_id)
            conn.execute("DELETE FROM user_sessions WHERE user_id = ?", (user_id,))
            memories = conn.execute("DELETE FROM memories WHERE user_id = ?", (user_id,))
            return len(sessions) + memories.rowcount

        return await self._db.write(op)

    async def aclose(self) -> None:
        await self._db.aclose()


def _next_index(conn: sqlite3.Connection, session_id: str) -> int:
    row = conn.execute(
        "SELECT next_index FROM archive_heads WHERE session_id = ?", (session_id,)
    ).fetchone()
    return int(row[0]) if row else 0


def _visible_turn(conn: sqlite3.Connection, session_id: str, index: int, now_us: int) -> str | None:
    if index > _MAX_INDEX:
        return None
    row = conn.execute(
        "SELECT payload FROM turns WHERE session_id = ? AND idx = ? "
        "AND (expires_at_us IS NULL OR expires_at_us > ?)",
        (session_id, index, now_us),
    ).fetchone()
    return None if row is None else str(row[0])


def _delete_session(conn: sqlite3.Connection, session_id: str) -> None:
    """A session's turns, archive head and records (not its place in users' lists)."""
    conn.execute("DELETE FROM turns WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM archive_heads WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM session_records WHERE session_id = ?", (session_id,))
