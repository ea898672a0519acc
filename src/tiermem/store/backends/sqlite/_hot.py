"""The hot tier in SQLite: :class:`SQLiteHotStore`.

A session is a ``hot_sessions`` row (version, next turn index, expiry, metadata) plus its
rows in ``hot_turns``, ``hot_entities`` and ``hot_state``; its handoff bookkeeping is its
``activity`` row. Every write is one ``BEGIN IMMEDIATE`` transaction that reads the
session's row, checks versions, and writes; a session whose expiry has passed reads as
absent, and the next write deletes its old rows before starting it afresh.

Statements per operation, all in one transaction (one call to the worker thread, whose
group commit may share the transaction with other calls): ``append_turns`` reads the
session row, then updates it, upserts the activity entry, inserts the turns (executemany)
and trims the window, plus one delete and one upsert (executemany) when it changes
entities; ``load`` is 4 reads; ``restore`` reads the session
row, deletes the session's rows (4 statements) and writes them anew (session row, turns,
entities, state, activity); ``copy_state`` and ``put_state`` read the session row and the
blob, then write the session row, the activity entry and the blob; ``update_entities`` on
an absent session reads one row and writes nothing. A write that starts a session deletes
an expired predecessor's rows first (4 statements); every 64th write adds a bounded
collection pass.

The shared keyspace (blobs of no session, such as circuit breakers) is the ``hot_shared``
table, one row per name (version, expiry, the blob's JSON), untouched by anything a
session does. ``get_shared`` is one read; ``put_shared`` reads the row and upserts it in
one write transaction (plus the collection pass every 64th write, which also deletes
shared blobs expired for longer than ``gc_grace``); ``delete_shared`` reads the row and
deletes it.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from tiermem.clock import Clock, SystemClock
from tiermem.errors import ConflictError, ValidationError
from tiermem.models import (
    ActiveEntity,
    JsonValue,
    NewTurn,
    SessionMetadata,
    SessionSnapshot,
    StateBlob,
    Turn,
)
from tiermem.store.backends.sqlite._connection import SQLiteDatabase
from tiermem.store.backends.sqlite._mapping import (
    DEFAULT_BUSY_TIMEOUT,
    DEFAULT_SYNCHRONOUS,
    Synchronous,
    from_epoch_us,
    to_epoch_us,
)
from tiermem.store.codec import (
    check_append,
    check_kind,
    check_restore,
    decode_turns,
    encode_data,
    encode_shared,
    encode_turn,
    held_expired,
)
from tiermem.store.contract import DEFAULT_GC_GRACE, Capability, EntityChange, HotAppendResult
from tiermem.store.keys import validate_id

__all__ = ["SQLiteHotStore"]

_GC_EVERY_WRITES = 64
"""Collect long-expired sessions on the first write and then on every 64th."""
_GC_BATCH = 100
"""At most this many sessions are collected per write, so no write stalls on cleanup."""
_MICROSECOND = timedelta(microseconds=1)
_DELETE_SESSION_ROWS = (
    "DELETE FROM hot_turns WHERE session_id = ?",
    "DELETE FROM hot_entities WHERE session_id = ?",
    "DELETE FROM hot_state WHERE session_id = ?",
    "DELETE FROM hot_sessions WHERE session_id = ?",
)


@dataclass(frozen=True)
class _Head:
    """A live session's ``hot_sessions`` row."""

    version: int
    next_index: int
    expires_at_us: int
    metadata: str | None


def _live_head(
    conn: sqlite3.Connection, session_id: str, now_us: int, *, include_expired: bool = False
) -> _Head | None:
    row = conn.execute(
        "SELECT version, next_index, expires_at_us, metadata FROM hot_sessions "
        "WHERE session_id = ?",
        (session_id,),
    ).fetchone()
    if row is None or (not include_expired and not now_us < row[2]):  # as codec.is_live
        return None
    return _Head(*row)


def _live_shared(conn: sqlite3.Connection, name: str, now_us: int) -> tuple[int, str] | None:
    """The version and JSON of a live shared blob, or None if it is absent or expired."""
    row = conn.execute(
        "SELECT version, payload, expires_at_us FROM hot_shared WHERE name = ?", (name,)
    ).fetchone()
    if row is None or (row[2] is not None and not now_us < row[2]):  # as codec.is_live
        return None
    return int(row[0]), str(row[1])


def _delete_session_rows(conn: sqlite3.Connection, session_id: str) -> None:
    """Remove a session's data (not its activity entry, which handoff still needs)."""
    for statement in _DELETE_SESSION_ROWS:
        conn.execute(statement, (session_id,))


def _check_version(head: _Head | None, expected: int | None, session_id: str) -> None:
    actual = head.version if head else 0
    if expected is not None and expected != actual:
        raise ConflictError(
            f"session {session_id!r} is at version {actual}, not {expected}; reload it and retry",
            expected=expected,
            actual=actual,
        )


def _write(
    conn: sqlite3.Connection,
    session_id: str,
    head: _Head | None,
    *,
    expires_at_us: int,
    next_index: int | None = None,
    metadata: str | None = None,
) -> int:
    """Count one more write to the session (starting it afresh if absent); its new version.

    ``next_index`` and ``metadata``, when given, are set in the same statement. The
    session's activity entry gets the new expiry and loses any lease.
    """
    if head is None:
        _delete_session_rows(conn, session_id)  # leftovers of an expired session
        version = 1
        conn.execute(
            "INSERT INTO hot_sessions (session_id, version, next_index, expires_at_us, metadata) "
            "VALUES (?, 1, ?, ?, ?)",
            (session_id, next_index or 0, expires_at_us, metadata),
        )
    else:
        version = head.version + 1
        conn.execute(
            "UPDATE hot_sessions SET version = ?, expires_at_us = ?, "
            "next_index = coalesce(?, next_index), metadata = coalesce(?, metadata) "
            "WHERE session_id = ?",
            (version, expires_at_us, next_index, metadata, session_id),
        )
    _set_activity(conn, session_id, expires_at_us)
    return version


def _set_activity(conn: sqlite3.Connection, session_id: str, expires_at_us: int) -> None:
    conn.execute(
        "INSERT INTO activity (session_id, expires_at_us, lease_owner, lease_until_us) "
        "VALUES (?, ?, NULL, NULL) "
        "ON CONFLICT (session_id) DO UPDATE SET expires_at_us = excluded.expires_at_us, "
        "lease_owner = NULL, lease_until_us = NULL",
        (session_id, expires_at_us),
    )


def _check_entities(entities: Mapping[str, ActiveEntity], *, what: str) -> None:
    for entity in entities.values():
        if not isinstance(entity, ActiveEntity):
            raise ValidationError(f"{what} takes ActiveEntity values, got {type(entity).__name__}")


def _entity_change_rows(
    session_id: str, change: EntityChange | None
) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """The rows an append's entity change deletes and upserts, validated at the edge.

    Raises:
        ValidationError: not an EntityChange, or a bad kind.
    """
    if change is None:
        return [], []
    if not isinstance(change, EntityChange):
        raise ValidationError(f"entities takes an EntityChange, got {type(change).__name__}")
    for kind in [*change.upsert, *change.remove]:
        check_kind(kind, what="entity kind")
    _check_entities(change.upsert, what="append_turns")
    return (
        [(session_id, kind) for kind in change.remove],
        [(session_id, kind, entity.model_dump_json()) for kind, entity in change.upsert.items()],
    )


def _change_entities(
    conn: sqlite3.Connection,
    removed: Sequence[tuple[str, str]],
    upserted: Sequence[tuple[str, str, str]],
) -> None:
    """Merge into a session's entities: remove some kinds, then set others."""
    conn.executemany("DELETE FROM hot_entities WHERE session_id = ? AND kind = ?", removed)
    conn.executemany(
        "INSERT INTO hot_entities (session_id, kind, payload) VALUES (?, ?, ?) "
        "ON CONFLICT (session_id, kind) DO UPDATE SET payload = excluded.payload",
        upserted,
    )


def _encode_blob(name: str, blob: StateBlob) -> str:
    """A state blob's JSON, after the same checks as :meth:`SQLiteHotStore.put_state`."""
    check_kind(name, what="state name")
    if not isinstance(blob, StateBlob):
        raise ValidationError(f"state {name!r} must be a StateBlob, got {type(blob).__name__}")
    if blob.name != name:
        raise ValidationError(f"state blob {blob.name!r} was given under the name {name!r}")
    encode_data(blob.data, what=f"state {name!r}")  # the size limit put_state applies
    return blob.model_dump_json()


class SQLiteHotStore:
    """Hot tier in a SQLite file. See :class:`tiermem.store.contract.HotStore`.

    ``path`` must be a file (see :func:`default_database_path`); it may be the same file
    as a :class:`SQLiteDurableStore`'s. Sessions expired for longer than ``gc_grace`` are
    deleted by later writes, a few at a time; expiry as readers see it is always exact.

    Raises (every method):
        BackendTimeoutError: another connection held the write lock for ``busy_timeout``.
        BackendError: SQLite failed otherwise (full disk, corrupt file...).
    """

    name = "sqlite"
    capabilities = frozenset(
        {Capability.PERSISTENT, Capability.ENTITIES_IN_APPEND, Capability.KEEP_EXPIRED}
    )

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        gc_grace: timedelta = DEFAULT_GC_GRACE,
        busy_timeout: timedelta = DEFAULT_BUSY_TIMEOUT,
        synchronous: Synchronous = DEFAULT_SYNCHRONOUS,
    ) -> None:
        self._db = SQLiteDatabase(
            path, role="hot", busy_timeout=busy_timeout, synchronous=synchronous
        )
        self._clock = clock or SystemClock()
        self._gc_grace_us = gc_grace // _MICROSECOND
        self._writes = 0  # touched only on the database's worker thread

    def _now_us(self) -> int:
        return to_epoch_us(self._clock.now(), what="clock.now()")

    def _collect_garbage(self, conn: sqlite3.Connection, now_us: int) -> None:
        """Delete sessions expired for longer than gc_grace, now and then (during a write)."""
        self._writes += 1
        if (self._writes - 1) % _GC_EVERY_WRITES:
            return
        stale = conn.execute(
            "SELECT session_id FROM hot_sessions WHERE expires_at_us <= ? LIMIT ?",
            (now_us - self._gc_grace_us, _GC_BATCH),
        ).fetchall()
        for (session_id,) in stale:
            _delete_session_rows(conn, session_id)
        conn.execute(
            "DELETE FROM hot_shared WHERE name IN (SELECT name FROM hot_shared "
            "WHERE expires_at_us <= ? LIMIT ?)",
            (now_us - self._gc_grace_us, _GC_BATCH),
        )

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[NewTurn],
        *,
        window: int,
        expires_at: datetime,
        first_index: int | None = None,
        metadata: SessionMetadata | None = None,
        expected_version: int | None = None,
        entities: EntityChange | None = None,
        keep_expired: bool = False,
    ) -> HotAppendResult:
        check_append(session_id, turns, window=window, first_index=first_index)
        expires_at_us = to_epoch_us(expires_at, what="expires_at")
        metadata_json = metadata.model_dump_json() if metadata is not None else None
        removed, upserted = _entity_change_rows(session_id, entities)

        def op(conn: sqlite3.Connection) -> HotAppendResult:
            now_us = self._now_us()
            head = _live_head(conn, session_id, now_us)
            if head is None and keep_expired:
                held = _live_head(conn, session_id, now_us, include_expired=True)
                if held is not None and now_us < held.expires_at_us + self._gc_grace_us:
                    raise held_expired(session_id, held.version)  # as load(include_expired)
            _check_version(head, expected_version, session_id)
            start = head.next_index if head else (first_index or 0)
            if head is not None and first_index is not None and first_index != start:
                raise ConflictError(
                    f"session {session_id!r}: next turn index is {start}, not {first_index}",
                    expected=first_index,
                    actual=start,
                )
            indexed = [turn.with_index(start + i) for i, turn in enumerate(turns)]
            payloads = [encode_turn(turn) for turn in indexed]  # size check before writing
            next_index = start + len(indexed)
            version = _write(
                conn,
                session_id,
                head,
                expires_at_us=expires_at_us,
                next_index=next_index,
                metadata=metadata_json,
            )
            conn.executemany(
                "INSERT INTO hot_turns (session_id, idx, payload) VALUES (?, ?, ?)",
                [(session_id, t.index, p) for t, p in zip(indexed, payloads, strict=True)],
            )
            # Hot turns are contiguous and end at next_index - 1, so the window is a range.
            conn.execute(
                "DELETE FROM hot_turns WHERE session_id = ? AND idx < ?",
                (session_id, next_index - window),
            )
            if removed or upserted:
                _change_entities(conn, removed, upserted)
            self._collect_garbage(conn, now_us)
            return HotAppendResult(turns=tuple(indexed), version=version, next_index=next_index)

        return await self._db.write(op, direct=self._db.alone(session_id))

    async def load(
        self, session_id: str, *, include_expired: bool = False
    ) -> SessionSnapshot | None:
        validate_id(session_id, what="session_id")

        def op(conn: sqlite3.Connection) -> SessionSnapshot | None:
            now_us = self._now_us()
            head = _live_head(conn, session_id, now_us, include_expired=include_expired)
            if head is not None and now_us >= head.expires_at_us + self._gc_grace_us:
                return None  # past the grace period: as good as collected
            if head is None:
                return None
            turns = conn.execute(
                "SELECT payload FROM hot_turns WHERE session_id = ? ORDER BY idx", (session_id,)
            ).fetchall()
            entities = conn.execute(
                "SELECT kind, payload FROM hot_entities WHERE session_id = ?", (session_id,)
            ).fetchall()
            state = conn.execute(
                "SELECT name, payload FROM hot_state WHERE session_id = ?", (session_id,)
            ).fetchall()
            return SessionSnapshot(
                session_id=session_id,
                turns=tuple(decode_turns((p for (p,) in turns), session_id=session_id)),
                metadata=(
                    SessionMetadata.model_validate_json(head.metadata)
                    if head.metadata is not None
                    else None
                ),
                entities={kind: ActiveEntity.model_validate_json(p) for kind, p in entities},
                state={name: StateBlob.model_validate_json(p) for name, p in state},
                version=head.version,
                next_index=head.next_index,
                expires_at=from_epoch_us(head.expires_at_us),
            )

        return await self._db.read(op)

    async def put_metadata(
        self,
        session_id: str,
        metadata: SessionMetadata,
        *,
        expires_at: datetime,
        expected_version: int | None = None,
    ) -> int:
        validate_id(session_id, what="session_id")
        expires_at_us = to_epoch_us(expires_at, what="expires_at")
        metadata_json = metadata.model_dump_json()

        def op(conn: sqlite3.Connection) -> int:
            now_us = self._now_us()
            head = _live_head(conn, session_id, now_us)
            _check_version(head, expected_version, session_id)
            version = _write(
                conn, session_id, head, expires_at_us=expires_at_us, metadata=metadata_json
            )
            self._collect_garbage(conn, now_us)
            return version

        return await self._db.write(op)

    async def update_entities(
        self,
        session_id: str,
        upsert: Mapping[str, ActiveEntity],
        remove: Collection[str] = (),
        *,
        expires_at: datetime,
    ) -> int | None:
        validate_id(session_id, what="session_id")
        for kind in [*upsert, *remove]:
            check_kind(kind, what="entity kind")
        _check_entities(upsert, what="update_entities")
        expires_at_us = to_epoch_us(expires_at, what="expires_at")
        rows = [(session_id, kind, entity.model_dump_json()) for kind, entity in upsert.items()]

        def op(conn: sqlite3.Connection) -> int | None:
            now_us = self._now_us()
            head = _live_head(conn, session_id, now_us)
            if head is None:
                return None  # entities never start a session (see the contract)
            version = _write(conn, session_id, head, expires_at_us=expires_at_us)
            _change_entities(conn, [(session_id, kind) for kind in remove], rows)
            self._collect_garbage(conn, now_us)
            return version

        return await self._db.write(op)

    async def restore(
        self,
        session_id: str,
        *,
        turns: Sequence[Turn],
        next_index: int,
        metadata: SessionMetadata,
        entities: Mapping[str, ActiveEntity],
        state: Mapping[str, StateBlob],
        window: int,
        expires_at: datetime,
        expected_version: int | None = None,
    ) -> int:
        check_restore(session_id, turns, next_index=next_index, window=window)
        if not isinstance(metadata, SessionMetadata):
            raise ValidationError(f"restore takes SessionMetadata, got {type(metadata).__name__}")
        for kind in entities:
            check_kind(kind, what="entity kind")
        _check_entities(entities, what="restore")
        state_rows = [
            (session_id, name, blob.version, _encode_blob(name, blob))
            for name, blob in state.items()
        ]
        expires_at_us = to_epoch_us(expires_at, what="expires_at")
        # Every turn is size-checked, as the reference does, though only the window is kept.
        payloads = [(turn.index, encode_turn(turn)) for turn in turns]
        turn_rows = [(session_id, index, payload) for index, payload in payloads[-window:]]
        entity_rows = [
            (session_id, kind, entity.model_dump_json()) for kind, entity in entities.items()
        ]
        metadata_json = metadata.model_dump_json()

        def op(conn: sqlite3.Connection) -> int:
            now_us = self._now_us()
            head = _live_head(conn, session_id, now_us)
            _check_version(head, expected_version, session_id)
            version = (head.version if head else 0) + 1
            _delete_session_rows(conn, session_id)
            conn.execute(
                "INSERT INTO hot_sessions (session_id, version, next_index, expires_at_us, "
                "metadata) VALUES (?, ?, ?, ?, ?)",
                (session_id, version, next_index, expires_at_us, metadata_json),
            )
            conn.executemany(
                "INSERT INTO hot_turns (session_id, idx, payload) VALUES (?, ?, ?)", turn_rows
            )
            conn.executemany(
                "INSERT INTO hot_entities (session_id, kind, payload) VALUES (?, ?, ?)",
                entity_rows,
            )
            conn.executemany(
                "INSERT INTO hot_state (session_id, name, version, payload) VALUES (?, ?, ?, ?)",
                state_rows,
            )
            _set_activity(conn, session_id, expires_at_us)
            self._collect_garbage(conn, now_us)
            return version

        return await self._db.write(op)

    async def get_state(self, session_id: str, name: str) -> StateBlob | None:
        validate_id(session_id, what="session_id")
        check_kind(name, what="state name")

        def op(conn: sqlite3.Connection) -> StateBlob | None:
            if _live_head(conn, session_id, self._now_us()) is None:
                return None
            row = conn.execute(
                "SELECT payload FROM hot_state WHERE session_id = ? AND name = ?",
                (session_id, name),
            ).fetchone()
            return StateBlob.model_validate_json(row[0]) if row else None

        return await self._db.read(op)

    async def put_state(
        self,
        session_id: str,
        name: str,
        data: Mapping[str, JsonValue],
        *,
        expires_at: datetime,
        expected_version: int | None = None,
    ) -> StateBlob:
        validate_id(session_id, what="session_id")
        check_kind(name, what="state name")
        # A JSON round trip gives the blob its own copy of the data, as the reference does.
        copy = json.loads(encode_data(data, what=f"state {name!r}"))
        expires_at_us = to_epoch_us(expires_at, what="expires_at")

        def op(conn: sqlite3.Connection) -> StateBlob:
            now = self._clock.now()
            now_us = to_epoch_us(now, what="clock.now()")
            head = _live_head(conn, session_id, now_us)
            row = None
            if head is not None:
                row = conn.execute(
                    "SELECT version FROM hot_state WHERE session_id = ? AND name = ?",
                    (session_id, name),
                ).fetchone()
            actual = int(row[0]) if row else 0
            if expected_version is not None and expected_version != actual:
                raise ConflictError(
                    f"state {name!r} of session {session_id!r} is at version {actual}, "
                    f"not {expected_version}; re-read it and retry",
                    expected=expected_version,
                    actual=actual,
                )
            _write(conn, session_id, head, expires_at_us=expires_at_us)
            blob = StateBlob(name=name, data=copy, version=actual + 1, updated_at=now)
            conn.execute(
                "INSERT INTO hot_state (session_id, name, version, payload) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (session_id, name) DO UPDATE SET version = excluded.version, "
                "payload = excluded.payload",
                (session_id, name, blob.version, blob.model_dump_json()),
            )
            self._collect_garbage(conn, now_us)
            return blob

        return await self._db.write(op)

    async def copy_state(self, session_id: str, blob: StateBlob, *, expires_at: datetime) -> bool:
        validate_id(session_id, what="session_id")
        payload = _encode_blob(blob.name, blob)
        expires_at_us = to_epoch_us(expires_at, what="expires_at")

        def op(conn: sqlite3.Connection) -> bool:
            now_us = self._now_us()
            head = _live_head(conn, session_id, now_us)
            if head is None:
                return False  # a copy never starts a session
            row = conn.execute(
                "SELECT version FROM hot_state WHERE session_id = ? AND name = ?",
                (session_id, blob.name),
            ).fetchone()
            if row is not None and int(row[0]) >= blob.version:
                return False  # the hot copy is as new or newer: keep it
            _write(conn, session_id, head, expires_at_us=expires_at_us)
            conn.execute(
                "INSERT INTO hot_state (session_id, name, version, payload) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (session_id, name) DO UPDATE SET version = excluded.version, "
                "payload = excluded.payload",
                (session_id, blob.name, blob.version, payload),
            )
            self._collect_garbage(conn, now_us)
            return True

        return await self._db.write(op)

    async def touch(self, session_id: str, *, expires_at: datetime) -> bool:
        validate_id(session_id, what="session_id")
        expires_at_us = to_epoch_us(expires_at, what="expires_at")

        def op(conn: sqlite3.Connection) -> bool:
            if _live_head(conn, session_id, self._now_us()) is None:
                return False
            conn.execute(
                "UPDATE hot_sessions SET expires_at_us = ? WHERE session_id = ?",
                (expires_at_us, session_id),
            )
            _set_activity(conn, session_id, expires_at_us)
            return True

        return await self._db.write(op)

    async def delete(self, session_id: str) -> None:
        validate_id(session_id, what="session_id")

        def op(conn: sqlite3.Connection) -> None:
            _delete_session_rows(conn, session_id)
            conn.execute("DELETE FROM activity WHERE session_id = ?", (session_id,))

        await self._db.write(op)

    async def claim_expired(self, *, owner: str, lease: timedelta, limit: int = 100) -> list[str]:
        validate_id(owner, what="owner")
        if limit < 0:
            raise ValidationError(f"limit must be >= 0, got {limit}")
        lease_us = lease // _MICROSECOND

        def op(conn: sqlite3.Connection) -> list[str]:
            now_us = self._now_us()
            due = [
                session_id
                for (session_id,) in conn.execute(
                    "SELECT session_id FROM activity WHERE expires_at_us <= ? "
                    "AND (lease_until_us IS NULL OR lease_until_us <= ?) "
                    "ORDER BY expires_at_us, session_id LIMIT ?",
                    (now_us, now_us, limit),
                )
            ]
            conn.executemany(
                "UPDATE activity SET lease_owner = ?, lease_until_us = ? WHERE session_id = ?",
                [(owner, now_us + lease_us, session_id) for session_id in due],
            )
            return due

        return await self._db.write(op)

    async def release_expired(self, session_id: str, *, owner: str) -> bool:
        validate_id(session_id, what="session_id")

        def op(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT lease_owner FROM activity WHERE session_id = ?", (session_id,)
            ).fetchone()
            if row is None or row[0] != owner:
                return False
            conn.execute("DELETE FROM activity WHERE session_id = ?", (session_id,))
            return True

        return await self._db.write(op)

    # -- shared keyspace ----------------------------------------------------------------

    async def get_shared(self, name: str) -> StateBlob | None:
        check_kind(name, what="shared name")

        def op(conn: sqlite3.Connection) -> StateBlob | None:
            row = _live_shared(conn, name, self._now_us())
            return StateBlob.model_validate_json(row[1]) if row else None

        return await self._db.read(op)

    async def put_shared(
        self,
        name: str,
        data: Mapping[str, JsonValue],
        *,
        expires_at: datetime | None,
        expected_version: int | None = None,
    ) -> StateBlob:
        check_kind(name, what="shared name")
        expires_at_us = None if expires_at is None else to_epoch_us(expires_at, what="expires_at")
        copy = json.loads(encode_shared(name, data))

        def op(conn: sqlite3.Connection) -> StateBlob:
            now = self._clock.now()
            now_us = to_epoch_us(now, what="clock.now()")
            row = _live_shared(conn, name, now_us)
            actual = int(row[0]) if row else 0
            if expected_version is not None and expected_version != actual:
                raise ConflictError(
                    f"shared blob {name!r} is at version {actual}, not {expected_version}; "
                    "re-read it and retry",
                    expected=expected_version,
                    actual=actual,
                )
            blob = StateBlob(name=name, data=copy, version=actual + 1, updated_at=now)
            conn.execute(
                "INSERT INTO hot_shared (name, version, expires_at_us, payload) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                "version = excluded.version, expires_at_us = excluded.expires_at_us, "
                "payload = excluded.payload",
                (name, blob.version, expires_at_us, blob.model_dump_json()),
            )
            self._collect_garbage(conn, now_us)
            return blob

        return await self._db.write(op)

    async def delete_shared(self, name: str) -> bool:
        check_kind(name, what="shared name")

        def op(conn: sqlite3.Connection) -> bool:
            live = _live_shared(conn, name, self._now_us()) is not None
            conn.execute("DELETE FROM hot_shared WHERE name = ?", (name,))
            return live

        return await self._db.write(op)

    async def aclose(self) -> None:
        await self._db.aclose()
