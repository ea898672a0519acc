"""The durable tier in SQLite: :class:`SQLiteDurableStore`.

A session's header is its ``sessions`` row: the archive's next index (kept apart from the
turns, so that collecting expired turns never frees a slot for reuse), its owner and its
lifetime. The turn archive is ``turns``; session records are ``session_records``; the keys
of idempotent appends are ``idempotency_keys``; long-term memories are ``memories``.
Searching memories is recall's job (:class:`~tiermem.longterm.index_sqlite.SQLiteIndex`).

A session whose lifetime has passed reads as absent (its turns expired with it). The next
write to its id starts it afresh: it drops the old records, keys and owner in the same
transaction, and keeps the next index, so a dead session's turns awaiting collection never
share an index with new ones. Collection (:meth:`SQLiteDurableStore._collect_garbage`)
removes it for good once ``gc_grace`` has passed too. It finds dead sessions by
``collect_at_us``, a lower bound of the lifetime (NULL only when the lifetime is forever
too), not by the lifetime itself: an append raises a live session's lifetime, and
indexing the lifetime moved the session's index entry on every append, one more page per
commit. A live session's lifetime only grows, so its writes leave the bound alone; a new
session's or a dead one's started afresh sets it no higher than the lifetime; and the
collector raises the bound of a session it finds still alive to the lifetime (NULL when
that is forever), so each session costs it at most one such look per lifetime extension.

Statements per operation, all in one transaction (one call to the worker thread, whose
group commit may share the transaction with other calls: see
:mod:`~tiermem.store.backends.sqlite._worker`):

* ``append_turns`` to a live session at its next index with a new key (the common case):
  1 update of the header (next index and lifetime), 1 read of it (joined, when the
  append changes entities, with the ``entities`` record), 1 insert of the turns
  (executemany), plus 1 insert of the key when one is given and 1 upsert of the
  ``entities`` record when entities change. Told the first index
  (:attr:`~tiermem.store.contract.Capability.OPTIMISTIC_APPEND`: a session handle passes
  its counter) and changing no entity, it skips the read: the update matched only if the
  header was at that index, so the turns start there. Any other append (a new or dead session, an
  unexpected index, a repeated key): that update changes nothing, then 1 read of the
  header joined with the idempotency key (and the ``entities`` record), and the writes
  above with an upsert of the header after the turns. A repeated key: the update, the
  read and 1 read of the stored turns.
* ``put_record``: 1 read of the header joined with the record, 1 upsert of the record,
  1 upsert of the header.
* ``register_session``: 1 read of the header; then nothing (held by another user), or
  1 write of the header and 1 insert into the owner's list.
* ``get_session``, ``get_record``, ``list_sessions``, ``next_index``: 1 read each.
* Starting a dead session afresh adds 3 statements; every 64th write adds a bounded
  collection pass.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from tiermem.clock import Clock, SystemClock
from tiermem.errors import ConflictError, CorruptDataError, NotFoundError, ValidationError
from tiermem.models import JsonValue, MemoryRecord, NewTurn, SessionRecord, SessionRef, Turn
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
    check_idempotency_key,
    check_index,
    check_kind,
    check_memory_ids,
    check_memory_version,
    check_range,
    decode_memory,
    decode_turn,
    decode_turns,
    encode_data,
    encode_memory,
    encode_turn,
)
from tiermem.store.contract import (
    DEFAULT_GC_GRACE,
    ENTITIES_RECORD,
    Capability,
    EntityChange,
)
from tiermem.store.keys import validate_id

__all__ = ["SQLiteDurableStore"]

logger = logging.getLogger(__name__)

_MAX_INDEX = 2**63 - 1
"""SQLite integers are 64-bit; larger indexes cannot exist, so queries clamp to this."""
_GC_EVERY_WRITES = 64
"""Collect on the first write and then on every 64th."""
_GC_BATCH = 100
"""Rows of each kind one collection pass deletes at most, so no write stalls on cleanup."""
_GC_SESSIONS = 10
"""Dead sessions one collection pass visits at most (each costs up to 4 statements)."""
_MICROSECOND = timedelta(microseconds=1)
_IDS_PER_SELECT = 500
"""Ids bound in one ``IN (...)``: under SQLite's historical 999-parameter limit."""
_DIRECT_ROWS = 256
"""Turns a read may return and still run directly on the caller's thread when the file is
idle (:meth:`~tiermem.store.backends.sqlite._connection.SQLiteDatabase.read`); larger
reads always go to the worker thread."""
TURN_CACHE_CHARS = 4_000_000
"""Payload characters of decoded turns :class:`_TurnCache` keeps: the bound for large
turns (the entry bound, :data:`TURN_CACHE_ENTRIES`, is reached first with turns of a few
hundred characters)."""
TURN_CACHE_ENTRIES = 2_048
"""Decoded turns :class:`_TurnCache` keeps in all: the summary job's re-reads of a few
tens of turns per session, for many sessions at once."""
TURN_CACHE_WINDOW = 24
"""Indexes below a session's last cached turn that :class:`_TurnCache` keeps (what the
summary job re-reads past its last target)."""
ENTITIES_CACHE_SESSIONS = 1_024
"""Sessions whose ``entities`` record :class:`_EntitiesCache` keeps parsed."""
ENTITIES_CACHE_CHARS = 4_000_000
"""Record JSON characters :class:`_EntitiesCache` keeps in all (records of a few hundred
characters, the common size, reach :data:`ENTITIES_CACHE_SESSIONS` first)."""
# Logical expiry in SQL, as codec.is_live: "(expires_at_us IS NULL OR expires_at_us > ?)"
# with now in epoch microseconds; spelled out in each statement so statements stay literals.

_SESSION_CHILDREN = (
    # (table, key column): a session's rows in each, deleted a batch at a time by the
    # collector. The IN over the primary key's second column works for WITHOUT ROWID too.
    ("turns", "idx"),
    ("session_records", "kind"),
    ("idempotency_keys", "idempotency_key"),
)


def _is_live(expires_at_us: int | None, now_us: int) -> bool:
    return expires_at_us is None or now_us < expires_at_us


def _optional_us(value: datetime | None) -> int | None:
    return None if value is None else to_epoch_us(value, what="expires_at")


def _optional_datetime(value_us: int | None) -> datetime | None:
    return None if value_us is None else from_epoch_us(value_us)


@dataclass(frozen=True)
class _Header:
    """A session's ``sessions`` row, live or dead."""

    next_index: int
    expires_at_us: int | None
    ref: str | None
    """The registration (SessionRef JSON), None while unregistered."""

    def live(self, now_us: int) -> bool:
        return _is_live(self.expires_at_us, now_us)


def _lifetime_after(header: _Header | None, now_us: int, expires_at_us: int | None) -> int | None:
    """The session's lifetime after a write giving ``expires_at_us``: the later of the two,
    None (forever) beating any time. A dead session's old lifetime no longer counts."""
    if header is None or not header.live(now_us):
        return expires_at_us
    if header.expires_at_us is None or expires_at_us is None:
        return None
    return max(header.expires_at_us, expires_at_us)


_APPEND_READ = (
    "SELECT s.next_index, s.expires_at_us, k.first_index, k.turn_count "
    "FROM sessions AS s LEFT JOIN idempotency_keys AS k "
    "ON k.session_id = s.session_id AND k.idempotency_key = ? "
    "WHERE s.session_id = ?"
)
_APPEND_READ_ENTITIES = (  # bound: the key, ENTITIES_RECORD, the session id
    "SELECT s.next_index, s.expires_at_us, k.first_index, k.turn_count, r.version, r.payload "
    "FROM sessions AS s LEFT JOIN idempotency_keys AS k "
    "ON k.session_id = s.session_id AND k.idempotency_key = ? "
    "LEFT JOIN session_records AS r ON r.session_id = s.session_id AND r.kind = ? "
    "WHERE s.session_id = ?"
)


def _append_update(*, keyed: bool, expected: bool) -> str:
    """The header update of an append to a live session: the next index moves past the
    turns and the lifetime becomes :func:`_lifetime_after`'s for a live session (SQL's
    ``max`` of two values is NULL, forever, when either is).

    It changes no row, and the append takes the read-first path (:data:`_APPEND_READ`),
    unless the session is live (``now`` bound after the session id), its next index is
    the expected one (bound next, when ``expected``) and the idempotency key is new (bound
    last, when ``keyed``). Then :data:`_APPEND_MOVED` reads what it wrote. Not ``UPDATE
    ... RETURNING``: one statement instead of two, but SQLite builds the returned rows in
    a temporary table on every run, which cost more than the read (callgrind: 53.5k
    instructions against 39.7k for the two, and 52.6k for the read and upsert before).
    """
    statement = (
        "UPDATE sessions SET next_index = next_index + ?, expires_at_us = max(expires_at_us, ?) "
        "WHERE session_id = ? AND (expires_at_us IS NULL OR expires_at_us > ?)"
    )
    if expected:
        statement += " AND next_index = ?"
    if keyed:
        statement += (
            " AND NOT EXISTS (SELECT 1 FROM idempotency_keys "
            "WHERE session_id = sessions.session_id AND idempotency_key = ?)"
        )
    return statement


_APPEND_UPDATES = {
    (keyed, expected): _append_update(keyed=keyed, expected=expected)
    for keyed in (False, True)
    for expected in (False, True)
}
_APPEND_MOVED = "SELECT next_index, expires_at_us FROM sessions WHERE session_id = ?"
"""The header as :func:`_append_update` left it: the next index past the turns, and the
lifetime."""
_APPEND_MOVED_ENTITIES = (  # bound: ENTITIES_RECORD, the session id
    "SELECT s.next_index, s.expires_at_us, r.version, r.payload "
    "FROM sessions AS s LEFT JOIN session_records AS r "
    "ON r.session_id = s.session_id AND r.kind = ? WHERE s.session_id = ?"
)
""":data:`_APPEND_MOVED` with the ``entities`` record an entity change merges into."""


_LOWER_COLLECT_AT = (
    "collect_at_us = CASE WHEN collect_at_us IS NULL OR collect_at_us > excluded.expires_at_us "
    "THEN excluded.expires_at_us ELSE collect_at_us END"
)
"""Keeps ``collect_at_us`` a lower bound of ``expires_at_us`` (module docstring) when a
write may lower the lifetime or give one to a session that had none: a new header, or a
dead session's started afresh. Any statement naming it rewrites the collection index's
entry, so the common write, to a live session (whose lifetime only grows), leaves it out."""
_UPSERT_LIVE_HEADER = (
    "INSERT INTO sessions (session_id, next_index, expires_at_us, collect_at_us) "
    "VALUES (?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET "
    "next_index = excluded.next_index, expires_at_us = excluded.expires_at_us"
)
"""An append's header write when the session is live: its lifetime only grew, so the
lower bound holds (the values bind the insert, which a live session never takes)."""
_UPSERT_NEW_HEADER = (
    "INSERT INTO sessions (session_id, next_index, expires_at_us, collect_at_us) "
    "VALUES (?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET "
    "next_index = excluded.next_index, expires_at_us = excluded.expires_at_us, " + _LOWER_COLLECT_AT
)
"""An append's header write for a new session or a dead one started afresh."""
_RECORD_HEADER = (
    "INSERT INTO sessions (session_id, next_index, expires_at_us, collect_at_us) "
    "VALUES (?, 0, ?, ?) ON CONFLICT (session_id) DO UPDATE SET "
    "expires_at_us = excluded.expires_at_us, " + _LOWER_COLLECT_AT
)
"""``put_record``'s header write."""
_CLAIM_HEADER = (  # constants only
    "INSERT INTO sessions (session_id, next_index, expires_at_us, collect_at_us, user_id, "  # noqa: S608
    "created_at_us, ref) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET expires_at_us = excluded.expires_at_us, "
    "user_id = excluded.user_id, created_at_us = excluded.created_at_us, ref = excluded.ref, "
    + _LOWER_COLLECT_AT
)
"""``register_session``'s header write when it claims the session."""


_PUT_MEMORY = (
    "INSERT INTO memories (user_id, memory_id, memory_type, created_at_us, "
    "expires_at_us, version, payload) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (user_id, memory_id) DO UPDATE SET "
    "memory_type = excluded.memory_type, created_at_us = excluded.created_at_us, "
    "expires_at_us = excluded.expires_at_us, version = excluded.version, "
    "payload = excluded.payload"
)
"""``put_memory`` without a condition."""
_CREATE_MEMORY = (
    _PUT_MEMORY + " WHERE CASE WHEN memories.expires_at_us IS NULL "
    "OR memories.expires_at_us > ? THEN memories.version ELSE 0 END = 0"
)
"""``put_memory`` expecting version 0 (bound: the key and columns, then now): inserted, or
written over an expired memory (which counts as version 0); no change over a live one."""
_REPLACE_MEMORY = (
    "UPDATE memories SET memory_type = ?, created_at_us = ?, expires_at_us = ?, version = ?, "
    "payload = ? WHERE user_id = ? AND memory_id = ? AND CASE WHEN expires_at_us IS NULL "
    "OR expires_at_us > ? THEN version ELSE 0 END = ?"
)
"""``put_memory`` expecting another version (bound: the columns, the key, now, the
version): written only over a memory at that version (an expired one is at 0)."""


@dataclass(frozen=True)
class _EntityRows:
    """An entity change, validated and serialized once, before the transaction."""

    upsert: dict[str, JsonValue]
    remove: tuple[str, ...]


def _entity_rows(change: EntityChange | None) -> _EntityRows | None:
    """Validate ``change`` at the edge; None when it changes nothing.

    Raises:
        ValidationError: not an EntityChange, or a bad kind.
    """
    if change is None:
        return None
    if not isinstance(change, EntityChange):
        raise ValidationError(f"entities takes an EntityChange, got {type(change).__name__}")
    for kind in [*change.upsert, *change.remove]:
        check_kind(kind, what="entity kind")
    if not change.upsert and not change.remove:
        return None
    return _EntityRows(
        upsert={kind: entity.model_dump(mode="json") for kind, entity in change.upsert.items()},
        remove=change.remove,
    )


def _merged_entities(
    held: Sequence[object],
    change: _EntityRows,
    now: datetime,
    lifetime_us: int | None,
    parsed: dict[str, JsonValue] | None = None,
) -> SessionRecord:
    """The ``entities`` record after ``change`` (a merge: other kinds stay), one version up
    from ``held`` (the stored version and record JSON, both None when there is none).
    ``parsed``: the ``data`` of that JSON when the caller has it already (a copy this
    merge may change), so it is not parsed again.

    Raises:
        ValidationError: the merged record is over the size limit.
    """
    version, payload = held
    data: dict[str, JsonValue] = {}
    if parsed is not None:
        data = parsed
    elif isinstance(payload, str):
        stored = json.loads(payload).get("data")
        if isinstance(stored, dict):
            data = stored
    for kind in change.remove:
        data.pop(kind, None)
    data.update(change.upsert)
    encode_data(data, what=f"record {ENTITIES_RECORD!r}")  # the size limit put_record applies
    return SessionRecord(
        kind=ENTITIES_RECORD,
        data=data,
        version=(version if isinstance(version, int) else 0) + 1,
        updated_at=now,
        expires_at=_optional_datetime(lifetime_us),
    )


_RECORD_TO_JSON = SessionRecord.__pydantic_serializer__.to_json
"""What ``SessionRecord.model_dump_json()`` calls, with its defaults (the same bytes),
without the wrapper's keyword arguments."""


def _upsert_record(conn: sqlite3.Connection, session_id: str, record: SessionRecord) -> str:
    """Write ``record``; return its JSON as written."""
    payload = _RECORD_TO_JSON(record).decode()
    conn.execute(
        "INSERT INTO session_records (session_id, kind, version, payload) "
        "VALUES (?, ?, ?, ?) ON CONFLICT (session_id, kind) DO UPDATE SET "
        "version = excluded.version, payload = excluded.payload",
        (session_id, record.kind, record.version, payload),
    )
    return payload


def _read_header(conn: sqlite3.Connection, session_id: str) -> _Header | None:
    row = conn.execute(
        "SELECT next_index, expires_at_us, ref FROM sessions WHERE session_id = ?",
        (session_id,),
    ).fetchone()
    return None if row is None else _Header(*row)


def _start_afresh(conn: sqlite3.Connection, session_id: str) -> None:
    """Drop what a dead session left (records, keys, owner) before its id is used again.

    Its turns expired with it and wait for the collector; the header stays, keeping the
    next index, and the caller's upsert gives it a new lifetime.
    """
    conn.execute("DELETE FROM session_records WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM idempotency_keys WHERE session_id = ?", (session_id,))
    conn.execute(
        "UPDATE sessions SET user_id = NULL, created_at_us = NULL, ref = NULL WHERE session_id = ?",
        (session_id,),
    )


class _TurnCache:
    """Decoded turns by session and index, each with the payload it was decoded from.

    Why: the archive's readers read the same recent turns again (the summary job reads a
    session's turns still pending, a few to a few tens past its last target; history and
    reloads read the tail), and decoding a turn (pydantic validation) costs tens of
    microseconds where comparing two payloads costs well under one. Decoding is a pure
    function of the payload, so an entry is used only when the payload just read is the
    one it was decoded from: a redacted turn, or a new turn at a reused index, is decoded
    afresh. Only what was decoded from the file goes in (not the turns an append wrote),
    so a cached turn is exactly what a fresh decode would give. Turns are frozen models,
    shared by every reader, as the in-memory store shares its own. A deletion empties the
    cache and a redaction drops the turn (an erasure leaves no copy behind).

    Bounds: putting a session's turn at index ``i`` drops its turn at ``i - window``, so a
    session read up its indexes keeps only its last ``window`` turns (older ones are
    rarely read again, and each kept turn is a handful of objects the garbage collector
    walks); in all at most ``max_entries`` turns and ``max_chars`` payload characters,
    first in, first out.
    """

    def __init__(
        self,
        max_chars: int = TURN_CACHE_CHARS,
        *,
        max_entries: int = TURN_CACHE_ENTRIES,
        window: int = TURN_CACHE_WINDOW,
    ) -> None:
        self._max_chars = max_chars
        self._max_entries = max_entries
        self._window = window
        self._chars = 0
        # Payloads and turns in two dicts with the same keys and order: no pair tuple per
        # entry for the garbage collector to track (the payload dict holds only strings).
        self._payloads: dict[tuple[str, int], str] = {}
        self._decoded: dict[tuple[str, int], Turn] = {}
        self._lock = threading.Lock()  # a store may be used from several threads' loops

    def __len__(self) -> int:
        return len(self._decoded)

    def decode(self, session_id: str, rows: Iterable[tuple[int, str]]) -> list[Turn]:
        """The turns of ``rows`` (index, payload), in order, skipping (and logging) any
        that cannot be decoded, as :func:`~tiermem.store.codec.decode_turns` does."""
        turns: list[Turn] = []
        with self._lock:
            payloads = self._payloads
            for index, payload in rows:
                key = (session_id, index)
                if payloads.get(key) == payload:
                    turns.append(self._decoded[key])
                    continue
                try:
                    turn = decode_turn(payload)
                except CorruptDataError as exc:
                    logger.warning("session %s: skipped an archived turn: %s", session_id, exc)
                    continue
                self._put(key, payload, turn)
                turns.append(turn)
        return turns

    def decode_one(self, session_id: str, index: int, payload: str) -> Turn:
        """One turn.

        Raises:
            CorruptDataError: the payload is not a turn this version can read.
        """
        key = (session_id, index)
        with self._lock:
            if self._payloads.get(key) == payload:
                return self._decoded[key]
            turn = decode_turn(payload)
            self._put(key, payload, turn)
            return turn

    def discard(self, session_id: str, index: int) -> None:
        """Forget one turn (after a redaction: no decoded copy of what it was is left)."""
        with self._lock:
            self._pop((session_id, index))

    def clear(self) -> None:
        with self._lock:
            self._payloads.clear()
            self._decoded.clear()
            self._chars = 0

    def _put(self, key: tuple[str, int], payload: str, turn: Turn) -> None:
        size = len(payload)
        if size > self._max_chars:
            return
        self._pop(key)
        # The session's turn a window below leaves (reads go up the indexes, so this keeps
        # each session's most recent turns).
        self._pop((key[0], key[1] - self._window))
        self._payloads[key] = payload
        self._decoded[key] = turn
        self._chars += size
        while self._chars > self._max_chars or len(self._payloads) > self._max_entries:
            self._pop(next(iter(self._payloads)))

    def _pop(self, key: tuple[str, int]) -> None:
        old = self._payloads.pop(key, None)
        if old is not None:
            self._chars -= len(old)
            del self._decoded[key]


class _EntitiesCache:
    """The ``data`` of sessions' ``entities`` records as this store last wrote them, each
    with the record JSON it was written as.

    Why: an append that changes entities merges the change into the stored record, read in
    the append's header read, and parsing that JSON again on every such append cost as much
    as the rest of the merge. An entry is used only when the record JSON just read from the
    file is exactly the one it holds (a string compare), so a record written since by
    anyone else (another store, process or connection, a ``put_record``), or a write that
    was rolled back, is parsed afresh. Only what this store wrote goes in. A deletion or a
    purge empties the cache (an erasure leaves no copy behind).

    Bounds: ``max_sessions`` entries and ``max_chars`` characters of record JSON in all
    (the parsed data is of the same order), first in, first out.
    """

    def __init__(
        self, max_sessions: int = ENTITIES_CACHE_SESSIONS, *, max_chars: int = ENTITIES_CACHE_CHARS
    ) -> None:
        self._max_sessions = max_sessions
        self._max_chars = max_chars
        self._chars = 0
        self._entries: dict[str, tuple[str, dict[str, JsonValue]]] = {}
        self._lock = threading.Lock()  # a store may be used from several threads' loops

    def __len__(self) -> int:
        return len(self._entries)

    def data(self, session_id: str, payload: object) -> dict[str, JsonValue] | None:
        """A copy of the data written as ``payload`` (to merge into), or None."""
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is None or entry[0] != payload:
                return None
            return dict(entry[1])

    def put(self, session_id: str, payload: str, data: dict[str, JsonValue]) -> None:
        """Remember ``data``, just written as ``payload``. The caller hands it over: it is
        not changed afterwards (merges change copies; values are never changed)."""
        with self._lock:
            self._pop(session_id)
            if len(payload) > self._max_chars:
                return
            self._entries[session_id] = (payload, data)
            self._chars += len(payload)
            while len(self._entries) > self._max_sessions or self._chars > self._max_chars:
                self._pop(next(iter(self._entries)))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._chars = 0

    def _pop(self, session_id: str) -> None:
        entry = self._entries.pop(session_id, None)
        if entry is not None:
            self._chars -= len(entry[0])


class SQLiteDurableStore:
    """Durable tier in a SQLite file. See :class:`tiermem.store.contract.DurableStore`.

    ``path`` must be a file (see :func:`default_database_path`); it may be the same file
    as a :class:`SQLiteHotStore`'s. ``synchronous`` is ``NORMAL`` (a committed write
    survives a process crash, not a power loss) or ``FULL`` (both). Expired turns are
    deleted by later writes, a few at a time, and so are sessions (header, records, keys,
    turns) whose lifetime passed more than ``gc_grace`` ago; expired memories are kept,
    since ``query_memories`` can still return them.

    Raises (every method):
        BackendTimeoutError: another connection held the write lock for ``busy_timeout``.
        BackendError: SQLite failed otherwise (full disk, corrupt file...).
    """

    name = "sqlite"
    capabilities = frozenset(
        {Capability.PERSISTENT, Capability.ENTITIES_IN_APPEND, Capability.OPTIMISTIC_APPEND}
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
            path, role="durable", busy_timeout=busy_timeout, synchronous=synchronous
        )
        self._clock = clock or SystemClock()
        self._gc_grace_us = gc_grace // _MICROSECOND
        self._writes = 0  # touched only on the database's worker thread
        self._turns = _TurnCache()
        self._entities = _EntitiesCache()

    def _now_us(self) -> int:
        return to_epoch_us(self._clock.now(), what="clock.now()")

    def _collect_garbage(self, conn: sqlite3.Connection, now_us: int) -> None:
        """Now and then (during a write), delete some expired turns and some sessions dead
        for longer than gc_grace, a bounded amount each time.

        A dead session goes child rows first, a batch of each per pass; its header (and
        with it the next index and the owner) goes in the pass that finds no rows left, so
        a new session under its id never meets an old turn at the same index.
        """
        self._writes += 1
        if (self._writes - 1) % _GC_EVERY_WRITES:
            return
        conn.execute(
            "DELETE FROM turns WHERE rowid IN (SELECT rowid FROM turns "
            "WHERE expires_at_us <= ? LIMIT ?)",
            (now_us, _GC_BATCH),
        )
        dead_before_us = now_us - self._gc_grace_us
        # Candidates by collect_at_us, a lower bound of the lifetime (module docstring):
        # those found still alive get it raised to their lifetime (NULL: forever), which
        # takes them out of the way until then.
        dead: list[str] = []
        for session_id, lifetime_us in conn.execute(
            "SELECT session_id, expires_at_us FROM sessions WHERE collect_at_us <= ? "
            "ORDER BY collect_at_us LIMIT ?",
            (dead_before_us, 2 * _GC_SESSIONS),
        ).fetchall():
            if lifetime_us is not None and lifetime_us <= dead_before_us:
                if len(dead) < _GC_SESSIONS:
                    dead.append(session_id)
            else:
                conn.execute(
                    "UPDATE sessions SET collect_at_us = expires_at_us WHERE session_id = ?",
                    (session_id,),
                )
        budget = dict.fromkeys(_SESSION_CHILDREN, _GC_BATCH)
        for session_id in dead:
            emptied = True
            for child in _SESSION_CHILDREN:
                table, key = child
                if budget[child] == 0:
                    emptied = False
                    continue
                # Only the constant names above are spliced into the statement.
                deleted = conn.execute(
                    f"DELETE FROM {table} WHERE session_id = ? AND {key} IN "  # noqa: S608
                    f"(SELECT {key} FROM {table} WHERE session_id = ? LIMIT ?)",
                    (session_id, session_id, budget[child]),
                ).rowcount
                emptied = emptied and deleted < budget[child]
                budget[child] -= deleted
            if emptied:
                conn.execute(
                    "DELETE FROM sessions WHERE session_id = ? AND expires_at_us <= ?",
                    (session_id, dead_before_us),
                )

    # -- turn archive -------------------------------------------------------------------

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[NewTurn],
        *,
        first_index: int | None = None,
        expires_at: datetime | None = None,
        idempotency_key: str | None = None,
        entities: EntityChange | None = None,
    ) -> list[Turn]:
        check_append(session_id, turns, first_index=first_index)
        check_idempotency_key(idempotency_key)
        change = _entity_rows(entities)
        expires_at_us = _optional_us(expires_at)

        update = _APPEND_UPDATES[idempotency_key is not None, first_index is not None]
        update_args: tuple[object, ...] = (len(turns), expires_at_us, session_id)
        conditions: tuple[object, ...] = tuple(
            value for value in (first_index, idempotency_key) if value is not None
        )

        def op(conn: sqlite3.Connection) -> list[Turn]:
            now = self._clock.now()
            now_us = to_epoch_us(now, what="clock.now()")
            # The common append (a live session, the expected index, a new key) moves the
            # header first, then reads where it put it; any other changes nothing here
            # and takes the read-first path below.
            if conn.execute(update, (*update_args, now_us, *conditions)).rowcount:
                if change is None:
                    held: Sequence[object] = (None, None)
                    if first_index is not None:  # it moved from there: nothing to read
                        return write(conn, first_index, None, True, held, now, now_us, moved=True)
                    moved = conn.execute(_APPEND_MOVED, (session_id,)).fetchone()
                else:
                    moved = conn.execute(
                        _APPEND_MOVED_ENTITIES, (ENTITIES_RECORD, session_id)
                    ).fetchone()
                    held = moved[2:4]
                start = moved[0] - len(turns)
                return write(conn, start, moved[1], True, held, now, now_us, moved=True)
            # The key (and the entities record, when it changes) ride along on the header
            # read: no extra statement when the key is new.
            if change is None:
                row = conn.execute(_APPEND_READ, (idempotency_key, session_id)).fetchone()
            else:
                row = conn.execute(
                    _APPEND_READ_ENTITIES, (idempotency_key, ENTITIES_RECORD, session_id)
                ).fetchone()
            header = None if row is None else _Header(row[0], row[1], None)
            live = header is not None and header.live(now_us)
            if live and row[2] is not None:  # a retry: the first append's turns, as stored now
                return _stored_turns(conn, session_id, row[2], row[2] + row[3], now_us)
            if header is not None and not live:
                _start_afresh(conn, session_id)
            start = header.next_index if header else 0
            if first_index is not None and first_index != start:
                raise ConflictError(
                    f"session {session_id!r}: next archived turn index is {start}, "
                    f"not {first_index}",
                    expected=first_index,
                    actual=start,
                )
            lifetime_us = _lifetime_after(header, now_us, expires_at_us)
            held = row[4:6] if change is not None and live and row is not None else (None, None)
            return write(conn, start, lifetime_us, live, held, now, now_us, moved=False)

        def write(
            conn: sqlite3.Connection,
            start: int,
            lifetime_us: int | None,
            live: bool,
            held: Sequence[object],
            now: datetime,
            now_us: int,
            *,
            moved: bool,
        ) -> list[Turn]:
            """The append's writes at ``start``; ``moved``: the header is written already."""
            indexed = [turn.with_index(start + i) for i, turn in enumerate(turns)]
            rows = [  # encoding checks the size (its error rolls back a moved header too)
                (session_id, turn.index, encode_turn(turn), expires_at_us) for turn in indexed
            ]
            record = None
            if change is not None:
                parsed = None if held[1] is None else self._entities.data(session_id, held[1])
                record = _merged_entities(held, change, now, lifetime_us, parsed)
            conn.executemany(
                "INSERT INTO turns (session_id, idx, payload, expires_at_us) VALUES (?, ?, ?, ?)",
                rows,
            )
            if not moved:
                conn.execute(
                    _UPSERT_LIVE_HEADER if live else _UPSERT_NEW_HEADER,
                    (session_id, start + len(indexed), lifetime_us, lifetime_us),
                )
            if idempotency_key is not None:
                conn.execute(
                    "INSERT INTO idempotency_keys "
                    "(session_id, idempotency_key, first_index, turn_count) VALUES (?, ?, ?, ?)",
                    (session_id, idempotency_key, start, len(indexed)),
                )
            if record is not None:
                written = _upsert_record(conn, session_id, record)
                self._entities.put(session_id, written, record.data)
            self._collect_garbage(conn, now_us)
            return indexed

        return await self._db.write(op, direct=self._db.alone(session_id))

    async def next_index(self, session_id: str) -> int:
        validate_id(session_id, what="session_id")
        return await self._db.read(
            lambda conn: _next_index(conn, session_id), direct=True, single=True
        )

    async def get_turn(self, session_id: str, index: int) -> Turn:
        validate_id(session_id, what="session_id")
        check_index(index)

        def op(conn: sqlite3.Connection) -> str | None:
            return _visible_turn(conn, session_id, index, self._now_us())

        payload = await self._db.read(op, direct=True, single=True)
        if payload is None:
            raise NotFoundError(f"session {session_id!r} has no turn {index}")
        return self._turns.decode_one(session_id, index, payload)

    async def get_turns(
        self, session_id: str, start: int = 0, end: int | None = None
    ) -> list[Turn]:
        validate_id(session_id, what="session_id")
        check_range(start, end)
        stop = _MAX_INDEX if end is None else min(end, _MAX_INDEX)

        def op(conn: sqlite3.Connection) -> list[tuple[int, str]]:
            return conn.execute(
                "SELECT idx, payload FROM turns WHERE session_id = ? AND idx >= ? AND idx < ? "
                "AND (expires_at_us IS NULL OR expires_at_us > ?) ORDER BY idx",
                (session_id, min(start, _MAX_INDEX), stop, self._now_us()),
            ).fetchall()

        return self._turns.decode(
            session_id,
            await self._db.read(
                op, direct=end is not None and end - start <= _DIRECT_ROWS, single=True
            ),
        )

    async def tail_turns(self, session_id: str, count: int) -> list[Turn]:
        validate_id(session_id, what="session_id")
        if count < 0:
            raise ValidationError(f"count must be >= 0, got {count}")
        if count == 0:
            return []

        def op(conn: sqlite3.Connection) -> list[tuple[int, str]]:
            return conn.execute(
                "SELECT idx, payload FROM turns WHERE session_id = ? "
                "AND (expires_at_us IS NULL OR expires_at_us > ?) ORDER BY idx DESC LIMIT ?",
                (session_id, self._now_us(), min(count, _MAX_INDEX)),
            ).fetchall()

        return self._turns.decode(
            session_id,
            reversed(await self._db.read(op, direct=count <= _DIRECT_ROWS, single=True)),
        )

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

        redacted = await self._db.write(op)
        self._turns.discard(session_id, index)  # the turn as it was leaves no decoded copy
        return redacted

    # -- sessions -----------------------------------------------------------------------

    async def register_session(
        self, ref: SessionRef, *, expires_at: datetime | None = None
    ) -> SessionRef:
        validate_id(ref.session_id, what="session_id")
        validate_id(ref.user_id, what="user_id")
        created_at_us = to_epoch_us(ref.created_at, what="created_at")
        expires_at_us = _optional_us(expires_at)
        session_id = ref.session_id

        def op(conn: sqlite3.Connection) -> SessionRef:
            now_us = self._now_us()
            header = _read_header(conn, session_id)
            live = header is not None and header.live(now_us)
            if live and header is not None and header.ref is not None:
                holder = SessionRef.model_validate_json(header.ref)
                if holder.user_id != ref.user_id:
                    return holder  # claimed by someone else: nothing written
                conn.execute(
                    "UPDATE sessions SET expires_at_us = ? WHERE session_id = ?",
                    (_lifetime_after(header, now_us, expires_at_us), session_id),
                )
                _list_for_user(conn, holder)
                self._collect_garbage(conn, now_us)
                return holder
            if header is not None and not live:
                _start_afresh(conn, session_id)
            # Free (never registered, dead, or written to before its registration): claim it.
            lifetime_us = _lifetime_after(header, now_us, expires_at_us)
            conn.execute(
                _CLAIM_HEADER,
                (
                    session_id,
                    header.next_index if header else 0,
                    lifetime_us,
                    lifetime_us,
                    ref.user_id,
                    created_at_us,
                    ref.model_dump_json(),
                ),
            )
            _list_for_user(conn, ref)
            self._collect_garbage(conn, now_us)
            return ref

        return await self._db.write(op, direct=self._db.alone(session_id))

    async def get_session(self, session_id: str) -> SessionRef | None:
        validate_id(session_id, what="session_id")

        def op(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT ref FROM sessions WHERE session_id = ? AND ref IS NOT NULL "
                "AND (expires_at_us IS NULL OR expires_at_us > ?)",
                (session_id, self._now_us()),
            ).fetchone()
            return None if row is None else str(row[0])

        payload = await self._db.read(op, direct=True, single=True)
        return None if payload is None else SessionRef.model_validate_json(payload)

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

        def op(conn: sqlite3.Connection) -> tuple[str, int | None] | None:
            row = conn.execute(
                "SELECT r.payload, s.expires_at_us FROM session_records AS r "
                "JOIN sessions AS s ON s.session_id = r.session_id "
                "WHERE r.session_id = ? AND r.kind = ? "
                "AND (s.expires_at_us IS NULL OR s.expires_at_us > ?)",
                (session_id, kind, self._now_us()),
            ).fetchone()
            return None if row is None else (str(row[0]), row[1])

        found = await self._db.read(op, direct=True, single=True)
        if found is None:
            return None
        payload, lifetime_us = found
        record = SessionRecord.model_validate_json(payload)
        # The record lives as long as its session, which later writes may have extended.
        return record.model_copy(update={"expires_at": _optional_datetime(lifetime_us)})

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
                "SELECT s.next_index, s.expires_at_us, r.version FROM sessions AS s "
                "LEFT JOIN session_records AS r ON r.session_id = s.session_id AND r.kind = ? "
                "WHERE s.session_id = ?",
                (kind, session_id),
            ).fetchone()
            header = None if row is None else _Header(row[0], row[1], None)
            live = header is not None and header.live(now_us)
            actual = int(row[2]) if live and row[2] is not None else 0
            if expected_version is not None and expected_version != actual:
                raise ConflictError(
                    f"record {kind!r} of session {session_id!r} is at version {actual}, "
                    f"not {expected_version}; re-read it and retry",
                    expected=expected_version,
                    actual=actual,
                )
            if header is not None and not live:
                _start_afresh(conn, session_id)
            lifetime_us = _lifetime_after(header, now_us, expires_at_us)
            record = SessionRecord(
                kind=kind,
                data=copy,
                version=actual + 1,
                updated_at=now,
                expires_at=_optional_datetime(lifetime_us),
            )
            _upsert_record(conn, session_id, record)
            conn.execute(
                _RECORD_HEADER,
                (session_id, lifetime_us, lifetime_us),
            )
            self._collect_garbage(conn, now_us)
            return record

        return await self._db.write(op, direct=self._db.alone(session_id))

    async def delete_session(self, session_id: str) -> None:
        validate_id(session_id, what="session_id")

        def op(conn: sqlite3.Connection) -> None:
            _delete_session(conn, session_id)
            conn.execute("DELETE FROM user_sessions WHERE session_id = ?", (session_id,))

        await self._db.write(op)
        self._turns.clear()  # rare: no need to pick out the session's entries
        self._entities.clear()

    # -- long-term memory -------------------------------------------------------------

    async def put_memory(
        self, record: MemoryRecord, *, expected_version: int | None = None
    ) -> MemoryRecord:
        payload = encode_memory(record)
        check_memory_version(record, expected_version)
        created_at_us = to_epoch_us(record.created_at)
        expires_at_us = _optional_us(record.expires_at)

        columns = (record.memory_type, created_at_us, expires_at_us, record.version, payload)
        key = (record.user_id, record.memory_id)

        def op(conn: sqlite3.Connection) -> MemoryRecord:
            if expected_version is None:
                conn.execute(_PUT_MEMORY, (*key, *columns))
                return record
            # The condition rides in the write (no read first): the version written
            # only if the stored one is the expected one, an expired memory counting as
            # version 0 (absent); else nothing changes, and the read below says why.
            now_us = self._now_us()
            if expected_version == 0:
                written = conn.execute(_CREATE_MEMORY, (*key, *columns, now_us)).rowcount
            else:
                written = conn.execute(
                    _REPLACE_MEMORY, (*columns, *key, now_us, expected_version)
                ).rowcount
            if written == 0:
                row = conn.execute(
                    "SELECT version, expires_at_us FROM memories "
                    "WHERE user_id = ? AND memory_id = ?",
                    key,
                ).fetchone()
                actual = int(row[0]) if row and _is_live(row[1], now_us) else 0
                raise ConflictError(
                    f"memory {record.memory_id!r} is at version {actual}, "
                    f"not {expected_version}; re-read it and retry",
                    expected=expected_version,
                    actual=actual,
                )
            return record

        return await self._db.write(op, direct=self._db.alone(record.user_id))

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

        payload = await self._db.read(op, direct=True, single=True)
        return None if payload is None else decode_memory(payload)

    async def get_memories(
        self, user_id: str, memory_ids: Collection[str]
    ) -> dict[str, MemoryRecord]:
        """One ``SELECT ... IN (...)`` per 500 ids, in one transaction; a small read (at
        most ``_DIRECT_ROWS`` ids, a recall's) runs on the calling thread, as
        :meth:`get_turns` does, sparing the executor hop."""
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

        rows = await self._db.read(op, direct=len(ids) <= _DIRECT_ROWS)
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
            # The sessions in the user's list that no one else has claimed since (dead or
            # alive): a purge leaves nothing of the user behind, and nothing of anyone else
            # is touched.
            doomed = (
                "SELECT u.session_id FROM user_sessions AS u "
                "LEFT JOIN sessions AS s ON s.session_id = u.session_id "
                "WHERE u.user_id = ? AND (s.user_id IS NULL OR s.user_id = u.user_id)"
            )
            for table, _ in _SESSION_CHILDREN:
                conn.execute(
                    f"DELETE FROM {table} WHERE session_id IN ({doomed})",  # noqa: S608 -- constants
                    (user_id,),
                )
            conn.execute(
                "DELETE FROM sessions WHERE session_id IN "
                "(SELECT session_id FROM user_sessions WHERE user_id = ?) "
                "AND (user_id IS NULL OR user_id = ?)",
                (user_id, user_id),
            )
            listed = conn.execute("DELETE FROM user_sessions WHERE user_id = ?", (user_id,))
            memories = conn.execute("DELETE FROM memories WHERE user_id = ?", (user_id,))
            return listed.rowcount + memories.rowcount

        removed = await self._db.write(op)
        self._turns.clear()  # rare: no need to pick out the user's sessions
        self._entities.clear()
        return removed

    async def aclose(self) -> None:
        await self._db.aclose()


def _next_index(conn: sqlite3.Connection, session_id: str) -> int:
    row = conn.execute(
        "SELECT next_index FROM sessions WHERE session_id = ?", (session_id,)
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


def _stored_turns(
    conn: sqlite3.Connection, session_id: str, start: int, end: int, now_us: int
) -> list[Turn]:
    """The live turns with ``start <= index < end``, in order."""
    rows = conn.execute(
        "SELECT payload FROM turns WHERE session_id = ? AND idx >= ? AND idx < ? "
        "AND (expires_at_us IS NULL OR expires_at_us > ?) ORDER BY idx",
        (session_id, start, end, now_us),
    )
    return decode_turns((payload for (payload,) in rows), session_id=session_id)


def _list_for_user(conn: sqlite3.Connection, ref: SessionRef) -> None:
    """Put the session in its owner's list, unless it is there already."""
    conn.execute(
        "INSERT INTO user_sessions (user_id, session_id, created_at_us, payload) "
        "VALUES (?, ?, ?, ?) ON CONFLICT (user_id, session_id) DO NOTHING",
        (ref.user_id, ref.session_id, to_epoch_us(ref.created_at), ref.model_dump_json()),
    )


def _delete_session(conn: sqlite3.Connection, session_id: str) -> None:
    """A session's turns, records, keys and header (not its place in users' lists)."""
    for table, _ in _SESSION_CHILDREN:
        # Only the constant table names above are spliced into the statement.
        conn.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))  # noqa: S608
    conn.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
