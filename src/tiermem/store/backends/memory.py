"""In-memory backend: the reference implementation of both storage roles.

It is the executable definition of the contract: every other backend must behave like it
under the conformance suite. It is also the embedded default's hot tier (one process, no
server). Data lives in dicts and dies with the process.

Layout::

    MemoryHotStore
    └── sessions: session_id → _HotSession
        ├── turns (window), next_index, version, expires_at
        ├── metadata, entities{kind}, state{name}
        ├── activity index: session_id → (expires_at, lease owner, lease until)
        └── shared: name → (StateBlob, expires_at)   (no session; circuit breakers)
    MemoryDurableStore
    ├── headers: session_id → _Header (owner ref, lifetime, idempotency keys)
    ├── turns:   session_id → {index → (Turn, expires_at)}
    ├── records: session_id → {kind → SessionRecord}   (live while the header lives)
    ├── users:   user_id → {session_id → SessionRef}
    └── memories: user_id → {memory_id → MemoryRecord}

Every method finishes without awaiting, so under one event loop each call is atomic; a
lock guards against use from several threads (the sync facade). The hot store also writes
a turn to both tiers in one step (``append_through``, the write-through path of
memory+memory): checked once, numbered once, both locks held.
"""

from __future__ import annotations

import heapq
import json
import math
import re
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import cast

from tiermem.clock import Clock, SystemClock
from tiermem.errors import ConflictError, NotFoundError, ValidationError
from tiermem.models import (
    ActiveEntity,
    JsonValue,
    MemoryRecord,
    NewTurn,
    SessionMetadata,
    SessionRecord,
    SessionRef,
    SessionSnapshot,
    StateBlob,
    TextBlock,
    Turn,
)
from tiermem.store.codec import (
    check_append,
    check_aware,
    check_idempotency_key,
    check_index,
    check_kind,
    check_limit,
    check_memory_ids,
    check_memory_version,
    check_range,
    check_restore,
    encode_data,
    encode_memory,
    encode_shared,
    encode_turn,
    held_expired,
    is_live,
)
from tiermem.store.contract import (
    DEFAULT_GC_GRACE,
    ENTITIES_RECORD,
    MAX_RECORD_BYTES,
    MAX_TURN_BYTES,
    Capability,
    DurableStore,
    EntityChange,
    HotAppendResult,
)
from tiermem.store.keys import validate_id

__all__ = ["HotParts", "MemoryDurableStore", "MemoryHotStore"]

HotParts = tuple[
    SessionMetadata,
    tuple[Turn, ...],
    dict[str, ActiveEntity],
    dict[str, StateBlob],
    int,
    datetime,
    datetime,
]
"""What :meth:`MemoryHotStore.read_now` returns: metadata, turns, entities, state, next
index and expiry of a live hot session, and the clock reading it was read at."""

_GC_PER_WRITE = 64
"""Most expired sessions one write collects (both stores)."""


@dataclass(slots=True)
class _HotSession:
    expires_at: datetime
    version: int = 0
    next_index: int = 0
    turns: tuple[Turn, ...] = ()  # immutable: a snapshot shares it, no copy per read
    metadata: SessionMetadata | None = None
    entities: dict[str, ActiveEntity] = field(default_factory=dict)
    state: dict[str, StateBlob] = field(default_factory=dict)


@dataclass(slots=True)
class _Activity:
    expires_at: datetime
    lease_owner: str | None = None
    lease_until: datetime | None = None


@dataclass(slots=True)
class _Shared:
    blob: StateBlob
    expires_at: datetime | None


class MemoryHotStore:
    """Hot tier in a dict. See :class:`tiermem.store.contract.HotStore`."""

    name = "memory"
    capabilities = frozenset(
        {
            Capability.NATIVE_TTL,
            Capability.CLUSTER_SAFE,
            Capability.ENTITIES_IN_APPEND,
            Capability.KEEP_EXPIRED,
        }
    )

    def __init__(
        self, *, clock: Clock | None = None, gc_grace: timedelta = DEFAULT_GC_GRACE
    ) -> None:
        self._clock = clock or SystemClock()
        self._gc_grace = gc_grace
        self._sessions: dict[str, _HotSession] = {}
        self._activity: dict[str, _Activity] = {}
        self._lock = threading.RLock()
        # Sessions by expiry, one entry per session (re-pushed when a session's expiry moved
        # on), so collection pops only what is due: O(log n) per write, no full scans.
        self._by_expiry: list[tuple[datetime, str]] = []
        self._queued: set[str] = set()
        self._shared: dict[str, _Shared] = {}
        # The same amortised collection for shared blobs that expire.
        self._shared_by_expiry: list[tuple[datetime, str]] = []
        self._shared_queued: set[str] = set()

    @property
    def clock(self) -> Clock:
        """The clock this store judges expiry by."""
        return self._clock

    def _queue_expiry(self, session_id: str, expires_at: datetime) -> None:
        if session_id not in self._queued:
            heapq.heappush(self._by_expiry, (expires_at, session_id))
            self._queued.add(session_id)

    def _collect_some(self, now: datetime) -> None:
        """Amortised garbage collection, as a native TTL would do: each write drops up to
        :data:`_GC_PER_WRITE` sessions past expiry + grace, oldest first. Sessions that are
        never touched again are still collected, at that rate, by writes to other sessions.
        """
        heap = self._by_expiry
        for _ in range(_GC_PER_WRITE):
            if not heap or heap[0][0] + self._gc_grace > now:
                return
            _, sid = heapq.heappop(heap)
            session = self._sessions.get(sid)
            if session is None:
                self._queued.discard(sid)
            elif now >= session.expires_at + self._gc_grace:
                # The activity entry stays: the session still awaits its handoff (which reads
                # the durable tier); the sweeper's release removes it.
                del self._sessions[sid]
                self._queued.discard(sid)
            else:
                heapq.heappush(heap, (session.expires_at, sid))

    def _live(
        self, session_id: str, now: datetime, *, include_expired: bool = False
    ) -> _HotSession | None:
        """The session as of ``now`` (one clock reading per store call), or None."""
        session = self._sessions.get(session_id)
        if session is None:
            return None
        if now >= session.expires_at + self._gc_grace:
            # Past the grace period: collect it, as a native TTL would.
            del self._sessions[session_id]
            return None
        if not include_expired and now >= session.expires_at:  # not is_live, inline
            return None
        return session

    def _write_target(self, session_id: str, now: datetime) -> _HotSession | None:
        """The live session, or None; an expired one is dropped so a write starts afresh."""
        session = self._live(session_id, now)
        if session is None:
            self._sessions.pop(session_id, None)
        return session

    def _write(self, session_id: str, expires_at: datetime, now: datetime) -> _HotSession:
        """The live session (created if absent) after one more write."""
        self._collect_some(now)
        return self._write_over(
            session_id, self._write_target(session_id, now), expires_at, now, collected=True
        )

    def _write_over(
        self,
        session_id: str,
        current: _HotSession | None,
        expires_at: datetime,
        now: datetime,
        *,
        collected: bool = False,
    ) -> _HotSession:
        """:meth:`_write` for a caller that already read the session with :meth:`_live` at
        ``now`` under the same lock (``current``): no second lookup. Collection cannot take
        a live session (it drops only those past expiry + grace, which ``_live`` refused),
        and an absent or expired one is replaced, as :meth:`_write_target` would."""
        if not collected:
            heap = self._by_expiry
            if heap and heap[0][0] + self._gc_grace <= now:  # else collection finds nothing
                self._collect_some(now)
        if current is None:
            current = self._sessions[session_id] = _HotSession(expires_at=expires_at)
        if session_id not in self._queued:
            heapq.heappush(self._by_expiry, (expires_at, session_id))
            self._queued.add(session_id)
        current.version += 1
        current.expires_at = expires_at
        activity = self._activity.get(session_id)
        if activity is None:
            self._activity[session_id] = _Activity(expires_at=expires_at)
        else:  # a write sets the expiry and ends any lease, as a fresh entry would
            activity.expires_at = expires_at
            activity.lease_owner = activity.lease_until = None
        return current

    @staticmethod
    def _check_version(session: _HotSession | None, expected: int | None, session_id: str) -> None:
        actual = session.version if session else 0
        if expected is not None and expected != actual:
            raise ConflictError(
                f"session {session_id!r} is at version {actual}, not {expected}; "
                "reload it and retry",
                expected=expected,
                actual=actual,
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
        _check_change(entities)
        with self._lock:
            now = self._clock.now()
            current = self._live(session_id, now)
            if current is None and keep_expired:
                held = self._live(session_id, now, include_expired=True)
                if held is not None:
                    raise held_expired(session_id, held.version)
            self._check_version(current, expected_version, session_id)
            start = current.next_index if current else (first_index or 0)
            if current is not None and first_index is not None and first_index != start:
                raise ConflictError(
                    f"session {session_id!r}: next turn index is {start}, not {first_index}",
                    expected=first_index,
                    actual=start,
                )
            indexed = _numbered(turns, start)
            for turn in indexed:
                _check_turn_size(turn)  # before anything changes
            version = self._append_checked(
                session_id,
                current,
                indexed,
                window,
                expires_at,
                now,
                metadata=metadata,
                entities=entities,
            )
        return _hot_result(indexed, version)

    def append_archived(
        self,
        session_id: str,
        turns: list[Turn],
        *,
        window: int,
        expires_at: datetime,
        entities: EntityChange | None = None,
    ) -> int:
        """:meth:`append_turns` of turns a durable store has just numbered and stored,
        pinned to the first one's index, without checking them again
        (:class:`~tiermem.store.contract.InProcessAppend`): the hot half of every
        write-through turn of the embedded default. Returns the session's new version.

        Raises:
            ConflictError: as :meth:`append_turns` with ``first_index``; nothing written.
        """
        first = turns[0].index
        with self._lock:
            now = self._clock.now()
            current = self._live(session_id, now)
            if current is not None and current.next_index != first:
                raise ConflictError(
                    f"session {session_id!r}: next turn index is {current.next_index}, not {first}",
                    expected=first,
                    actual=current.next_index,
                )
            return self._append_checked(
                session_id, current, turns, window, expires_at, now, entities=entities
            )

    def _append_checked(
        self,
        session_id: str,
        current: _HotSession | None,
        indexed: list[Turn],
        window: int,
        expires_at: datetime,
        now: datetime,
        *,
        metadata: SessionMetadata | None = None,
        entities: EntityChange | None = None,
    ) -> int:
        """Append turns already numbered from the session's next index and checked (sizes,
        entity kinds, versions) to ``current`` (the session as ``_live`` read it at ``now``):
        the write half of :meth:`append_turns`, under the lock. Returns the session's new
        version (its next index follows the last turn: :func:`_hot_result`)."""
        session = self._write_over(session_id, current, expires_at, now)
        session.turns = (*session.turns, *indexed)[-window:]
        session.next_index = indexed[-1].index + 1
        if metadata is not None:
            session.metadata = metadata
        if entities is not None:
            for kind in entities.remove:
                session.entities.pop(kind, None)
            session.entities.update(entities.upsert)
        return session.version

    # -- CombinedAppend ---------------------------------------------------------------------

    def can_append_through(self, durable: DurableStore) -> bool:
        """True for a :class:`MemoryDurableStore`: both live in this process, so one call
        holding both locks writes both tiers atomically. Subclasses on either side are
        refused: they may override ``append_turns`` (a test's fault injection, a store of
        an older contract), which this path would go around."""
        return type(self) is MemoryHotStore and type(durable) is MemoryDurableStore

    async def append_through(
        self,
        durable: DurableStore,
        session_id: str,
        turns: Sequence[NewTurn],
        *,
        window: int,
        hot_expires_at: datetime,
        durable_expires_at: datetime | None,
        idempotency_key: str | None = None,
        entities: EntityChange | None = None,
        first_index: int | None = None,
    ) -> tuple[list[Turn], HotAppendResult | None]:
        """Archive ``turns`` in ``durable`` and append them to the hot session in one atomic
        step (:class:`~tiermem.store.contract.CombinedAppend`). The turns are checked once,
        by the durable half; the hot half appends the very turns the archive numbered.

        Raises:
            ValidationError: as either tier's ``append_turns``, or ``durable`` is not one
                :meth:`can_append_through` accepts.
            ConflictError: ``first_index`` is not the archive's next index; nothing was
                written.
        """
        self._check_through(durable)
        check_append(session_id, turns, window=window, first_index=first_index)
        stored, version = self._through(
            durable,
            session_id,
            turns,
            window,
            hot_expires_at,
            durable_expires_at,
            idempotency_key,
            entities,
            first_index,
        )
        return stored, None if version is None else _hot_result(stored, version)

    async def append_built(
        self,
        durable: DurableStore,
        session_id: str,
        turns: Sequence[NewTurn],
        *,
        window: int,
        hot_expires_at: datetime,
        durable_expires_at: datetime | None,
        idempotency_key: str | None = None,
        entities: EntityChange | None = None,
        first_index: int | None = None,
        now: datetime | None = None,
    ) -> tuple[list[Turn], int | None]:
        """:meth:`append_through` for the tiered layer
        (:class:`~tiermem.store.contract.BuiltAppend`): the hot half's new version (None:
        skipped) comes back instead of a :class:`HotAppendResult` (the tiered layer reads
        only that). Every argument is checked as in :meth:`append_through`: the tiered
        layer's public ``append`` passes on a caller's session id, turns and count hint
        unchecked (the checks cost little: a known id is one set lookup). ``now``: a
        reading of :attr:`clock` the caller took for this write (its expiries), used
        instead of a second one; only an aware time is taken, else the clock is read.

        Raises:
            ValidationError: as :meth:`append_through`.
            ConflictError: as :meth:`append_through`.
        """
        self._check_through(durable)
        check_append(session_id, turns, window=window, first_index=first_index)
        return self._through(
            durable,
            session_id,
            turns,
            window,
            hot_expires_at,
            durable_expires_at,
            idempotency_key,
            entities,
            first_index,
            now if now is not None and now.tzinfo is UTC else None,
        )

    def _check_through(self, durable: DurableStore) -> None:
        # Both exact classes, the usual case, pass without the call.
        if not (
            type(self) is MemoryHotStore and type(durable) is MemoryDurableStore
        ) and not self.can_append_through(durable):
            raise ValidationError(
                "append_through needs a MemoryDurableStore (not a subclass); check "
                "can_append_through first"
            )

    def _through(
        self,
        durable: DurableStore,
        session_id: str,
        turns: Sequence[NewTurn],
        window: int,
        hot_expires_at: datetime,
        durable_expires_at: datetime | None,
        idempotency_key: str | None,
        entities: EntityChange | None,
        first_index: int | None,
        now: datetime | None = None,
    ) -> tuple[list[Turn], int | None]:
        """Both halves of :meth:`append_through` after the checks of its first arguments:
        the stored turns and the hot session's new version (None: the hot half skipped).
        ``now``: the caller's reading of this store's clock (None: read it here)."""
        assert isinstance(durable, MemoryDurableStore)
        # The usual arguments (UTC expiries, no key, no change) pass the checks without
        # calling them: this runs on every turn of memory+memory.
        key = None if idempotency_key is None else check_idempotency_key(idempotency_key)
        if hot_expires_at is not None and hot_expires_at.tzinfo is not UTC:
            check_aware(hot_expires_at, what="hot_expires_at")
        if durable_expires_at is not None and durable_expires_at.tzinfo is not UTC:
            check_aware(durable_expires_at, what="durable_expires_at")
        if entities is not None:
            _check_change(entities)
        with durable._lock, self._lock:
            if now is None:
                now = self._clock.now()  # one reading for both halves when they share a clock
            stored, repeat = durable._append_checked(
                session_id,
                turns,
                first_index,
                durable_expires_at,
                key,
                entities,
                now=now if durable._clock is self._clock else None,
            )
            if repeat or not stored:
                return stored, None
            current = self._live(session_id, now)
            if current is not None and current.next_index != stored[0].index:
                return stored, None  # the hot tier lost turns: the caller rebuilds it
            version = self._append_checked(
                session_id, current, stored, window, hot_expires_at, now, entities=entities
            )
            return stored, version

    async def load(
        self, session_id: str, *, include_expired: bool = False
    ) -> SessionSnapshot | None:
        validate_id(session_id, what="session_id")
        with self._lock:
            now = self._clock.now()
            session = self._live(session_id, now, include_expired=include_expired)
            if session is None:
                return None
            # Everything in it was validated on the way in: no second validation.
            return SessionSnapshot.trusted(
                {
                    "session_id": session_id,
                    "turns": session.turns,
                    "metadata": session.metadata,
                    "entities": dict(session.entities),
                    "state": dict(session.state),
                    "version": session.version,
                    "next_index": session.next_index,
                    "expires_at": session.expires_at,
                }
            )

    def read_now(self, session_id: str) -> HotParts | None:
        """:meth:`load` for a caller in this process that builds its own view (the tiered
        store's read, on every ``history()``): the live session's metadata, turns,
        entities, state, next index and expiry, without the snapshot object, or None when
        the session is absent, expired, or has no metadata yet (a write-behind append
        that reached an empty tier: :meth:`load` shows it). The turns are the store's
        immutable tuple; the two mappings are fresh copies, the caller's to keep. Last
        comes the reading of :attr:`clock` the session was judged live at (a caller on
        the same clock needs no second one).

        Raises:
            ValidationError: a bad session id.
        """
        validate_id(session_id, what="session_id")
        with self._lock:
            now = self._clock.now()
            session = self._live(session_id, now)
            if session is None:
                return None
            metadata = session.metadata
            if metadata is None:
                return None
            return (
                metadata,
                session.turns,
                dict(session.entities),
                dict(session.state),
                session.next_index,
                session.expires_at,
                now,
            )

    async def put_metadata(
        self,
        session_id: str,
        metadata: SessionMetadata,
        *,
        expires_at: datetime,
        expected_version: int | None = None,
    ) -> int:
        validate_id(session_id, what="session_id")
        with self._lock:
            now = self._clock.now()
            self._check_version(self._live(session_id, now), expected_version, session_id)
            session = self._write(session_id, expires_at, now)
            session.metadata = metadata
            return session.version

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
        with self._lock:
            now = self._clock.now()
            if self._live(session_id, now) is None:
                return None
            session = self._write(session_id, expires_at, now)
            for kind in remove:
                session.entities.pop(kind, None)
            session.entities.update(upsert)
            return session.version

    async def get_state(self, session_id: str, name: str) -> StateBlob | None:
        validate_id(session_id, what="session_id")
        check_kind(name, what="state name")
        with self._lock:
            now = self._clock.now()
            session = self._live(session_id, now)
            return session.state.get(name) if session else None

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
        # A JSON round trip gives the store its own copy, as a real backend would.
        copy = json.loads(encode_data(data, what=f"state {name!r}"))
        with self._lock:
            now = self._clock.now()
            current = self._live(session_id, now)
            blob = current.state.get(name) if current else None
            actual = blob.version if blob else 0
            if expected_version is not None and expected_version != actual:
                raise ConflictError(
                    f"state {name!r} of session {session_id!r} is at version {actual}, "
                    f"not {expected_version}; re-read it and retry",
                    expected=expected_version,
                    actual=actual,
                )
            session = self._write(session_id, expires_at, now)
            new = StateBlob(name=name, data=copy, version=actual + 1, updated_at=now)
            session.state[name] = new
            return new

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
        for kind in entities:
            check_kind(kind, what="entity kind")
        for name, blob in state.items():
            check_kind(name, what="state name")
            encode_data(blob.data, what=f"state {name!r}")
        for turn in turns:
            encode_turn(turn)
        with self._lock:
            now = self._clock.now()
            current = self._live(session_id, now)
            self._check_version(current, expected_version, session_id)
            version = (current.version if current else 0) + 1
            self._collect_some(now)
            self._sessions[session_id] = _HotSession(
                expires_at=expires_at,
                version=version,
                next_index=next_index,
                turns=tuple(turns)[-window:],
                metadata=metadata,
                entities=dict(entities),
                state=dict(state),
            )
            self._activity[session_id] = _Activity(expires_at=expires_at)
            self._queue_expiry(session_id, expires_at)
            return version

    async def copy_state(self, session_id: str, blob: StateBlob, *, expires_at: datetime) -> bool:
        validate_id(session_id, what="session_id")
        check_kind(blob.name, what="state name")
        encode_data(blob.data, what=f"state {blob.name!r}")
        with self._lock:
            now = self._clock.now()
            current = self._live(session_id, now)
            if current is None:
                return False
            held = current.state.get(blob.name)
            if held is not None and held.version >= blob.version:
                return False
            session = self._write(session_id, expires_at, now)
            session.state[blob.name] = blob
            return True

    async def touch(self, session_id: str, *, expires_at: datetime) -> bool:
        validate_id(session_id, what="session_id")
        with self._lock:
            now = self._clock.now()
            session = self._live(session_id, now)
            if session is None:
                return False
            session.expires_at = expires_at
            self._activity[session_id] = _Activity(expires_at=expires_at)
            return True

    async def delete(self, session_id: str) -> None:
        validate_id(session_id, what="session_id")
        with self._lock:
            self._sessions.pop(session_id, None)
            self._activity.pop(session_id, None)

    async def claim_expired(self, *, owner: str, lease: timedelta, limit: int = 100) -> list[str]:
        validate_id(owner, what="owner")
        check_limit(limit)
        now = self._clock.now()
        claimed: list[str] = []
        with self._lock:
            due = sorted(
                (entry.expires_at, sid)
                for sid, entry in self._activity.items()
                if entry.expires_at <= now
                and (entry.lease_until is None or entry.lease_until <= now)
            )
            for _, sid in due[:limit]:
                entry = self._activity[sid]
                entry.lease_owner, entry.lease_until = owner, now + lease
                claimed.append(sid)
        return claimed

    async def release_expired(self, session_id: str, *, owner: str) -> bool:
        validate_id(session_id, what="session_id")
        with self._lock:
            entry = self._activity.get(session_id)
            if entry is None or entry.lease_owner != owner:
                return False
            del self._activity[session_id]
            return True

    # -- shared keyspace --------------------------------------------------------------

    def _live_shared(self, name: str) -> _Shared | None:
        entry = self._shared.get(name)
        if entry is None:
            return None
        now = self._clock.now()
        if entry.expires_at is not None and now >= entry.expires_at + self._gc_grace:
            del self._shared[name]  # as a native TTL would
            return None
        return entry if is_live(entry.expires_at, now) else None

    def _collect_shared(self) -> None:
        """Drop up to :data:`_GC_PER_WRITE` shared blobs past expiry + grace, oldest first."""
        now = self._clock.now()
        heap = self._shared_by_expiry
        for _ in range(_GC_PER_WRITE):
            if not heap or heap[0][0] + self._gc_grace > now:
                return
            _, name = heapq.heappop(heap)
            entry = self._shared.get(name)
            if entry is None or entry.expires_at is None:
                self._shared_queued.discard(name)
            elif now >= entry.expires_at + self._gc_grace:
                del self._shared[name]
                self._shared_queued.discard(name)
            else:
                heapq.heappush(heap, (entry.expires_at, name))

    async def get_shared(self, name: str) -> StateBlob | None:
        check_kind(name, what="shared name")
        with self._lock:
            entry = self._live_shared(name)
            return entry.blob if entry else None

    async def put_shared(
        self,
        name: str,
        data: Mapping[str, JsonValue],
        *,
        expires_at: datetime | None,
        expected_version: int | None = None,
    ) -> StateBlob:
        check_kind(name, what="shared name")
        check_aware(expires_at, what="expires_at")
        copy = json.loads(encode_shared(name, data))
        with self._lock:
            current = self._live_shared(name)
            actual = current.blob.version if current else 0
            if expected_version is not None and expected_version != actual:
                raise ConflictError(
                    f"shared blob {name!r} is at version {actual}, not {expected_version}; "
                    "re-read it and retry",
                    expected=expected_version,
                    actual=actual,
                )
            self._collect_shared()
            blob = StateBlob(name=name, data=copy, version=actual + 1, updated_at=self._clock.now())
            self._shared[name] = _Shared(blob=blob, expires_at=expires_at)
            if expires_at is not None and name not in self._shared_queued:
                heapq.heappush(self._shared_by_expiry, (expires_at, name))
                self._shared_queued.add(name)
            return blob

    async def delete_shared(self, name: str) -> bool:
        check_kind(name, what="shared name")
        with self._lock:
            live = self._live_shared(name) is not None
            self._shared.pop(name, None)
            return live

    async def aclose(self) -> None:
        return None


@dataclass
class _EntitySizes:
    """The serialized size of each member of a session's ``entities`` record, for the
    record object they were measured on (a record replaced by ``put_record`` is measured
    again)."""

    record: SessionRecord
    sizes: dict[str, int]


@dataclass(slots=True)
class _PendingEntities:
    """A session's ``entities`` record as the appends left it, not yet built: what
    :meth:`MemoryDurableStore._set_record` would have stored, with each upserted entity
    kept as it came (an :class:`ActiveEntity`) instead of its JSON. Most sessions' record
    is written on many turns and read on none (a hot miss, a compare-and-set of the
    entities): dumping each entity (its ``isoformat`` alone costs more than the rest of
    its merge) is left to the first read, which builds the very record the eager write
    would have (:meth:`MemoryDurableStore._record`)."""

    members: dict[str, ActiveEntity | JsonValue]
    """The record's data in its order, an upserted entity as itself."""
    sizes: dict[str, int] | None
    """Each member's serialized size (None: not measurable, as ``_EntitySizes``)."""
    version: int
    updated_at: datetime
    expires_at: datetime | None


@dataclass
class _Header:
    """What a durable session is: who owns it and how long it lives (contract docstring)."""

    lifetime: datetime | None
    owner: SessionRef | None = None
    keys: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Idempotency key → (first index, count) of the append that used it."""


class MemoryDurableStore:
    """Durable tier in dicts (durable only for the life of the process).

    See :class:`tiermem.store.contract.DurableStore`.
    """

    name = "memory"
    capabilities = frozenset({Capability.NATIVE_TTL, Capability.ENTITIES_IN_APPEND})

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._headers: dict[str, _Header] = {}
        self._next: dict[str, int] = {}
        self._turns: dict[str, dict[int, Turn]] = {}
        # Each turn's expiry apart from the turn: a dict of datetimes is not tracked by the
        # garbage collector, where a (turn, expiry) pair per archived turn would be.
        self._turn_expiry: dict[str, dict[int, datetime | None]] = {}
        self._records: dict[str, dict[str, SessionRecord]] = {}
        self._entity_sizes: dict[str, _EntitySizes] = {}
        # The entities records appends wrote and nobody read since (not in ``_records``).
        self._pending_entities: dict[str, _PendingEntities] = {}
        self._by_lifetime: list[tuple[datetime, str]] = []
        self._queued: set[str] = set()
        self._users: dict[str, dict[str, SessionRef]] = {}
        self._memories: dict[str, dict[str, MemoryRecord]] = {}
        self._lock = threading.RLock()

    # -- turn archive -------------------------------------------------------------------

    def _next_index(self, session_id: str) -> int:
        return self._next.get(session_id, 0)

    def _header(self, session_id: str, now: datetime) -> _Header | None:
        """The session's header while it lives; a dead one is collected on sight. ``now``
        is the store call's one clock reading, as in every helper here."""
        header = self._headers.get(session_id)
        if header is not None and header.lifetime is not None and now >= header.lifetime:
            self._drop(session_id)  # not is_live (inline: this runs on every call)
            return None
        return header

    def _drop(self, session_id: str) -> None:
        """Forget a session entirely; its numbering restarts at 0 (the contract allows it,
        and keeping a counter per dead id forever would grow without bound)."""
        self._headers.pop(session_id, None)
        self._next.pop(session_id, None)
        self._turns.pop(session_id, None)
        self._turn_expiry.pop(session_id, None)
        self._records.pop(session_id, None)
        self._entity_sizes.pop(session_id, None)
        self._pending_entities.pop(session_id, None)

    def _extend(self, session_id: str, expires_at: datetime | None, now: datetime) -> _Header:
        """The live header with its lifetime raised to at least ``expires_at``."""
        heap = self._by_lifetime
        if heap and heap[0][0] <= now:  # else collection finds nothing
            self._collect_some(now)
        return self._extend_header(session_id, self._header(session_id, now), expires_at)

    def _extend_header(
        self, session_id: str, header: _Header | None, expires_at: datetime | None
    ) -> _Header:
        """:meth:`_extend` once collection ran and ``header`` is the live header (None:
        none)."""
        if header is None:
            header = self._headers[session_id] = _Header(lifetime=expires_at)
        else:  # later_of, inline
            lifetime = header.lifetime
            if lifetime is not None:
                header.lifetime = None if expires_at is None else max(lifetime, expires_at)
        if header.lifetime is not None and session_id not in self._queued:
            heapq.heappush(self._by_lifetime, (header.lifetime, session_id))
            self._queued.add(session_id)
        return header

    def _collect_some(self, now: datetime) -> None:
        """Amortised collection of dead sessions (oldest lifetime first) and of expired
        turns of the sessions it looks at; at most :data:`_GC_PER_WRITE` per write."""
        heap = self._by_lifetime
        for _ in range(_GC_PER_WRITE):
            if not heap or heap[0][0] > now:
                return
            _, sid = heapq.heappop(heap)
            header = self._headers.get(sid)
            if header is None or header.lifetime is None:
                self._queued.discard(sid)
            elif not is_live(header.lifetime, now):
                self._drop(sid)
                self._queued.discard(sid)
            else:
                # The session lived on: drop its expired turns, look again at its new end.
                archive = self._turns.get(sid, {})
                expiry = self._turn_expiry.get(sid, {})
                for index in [i for i, exp in expiry.items() if not is_live(exp, now)]:
                    del archive[index], expiry[index]
                heapq.heappush(heap, (header.lifetime, sid))

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
        key = check_idempotency_key(idempotency_key)
        check_aware(expires_at, what="expires_at")
        _check_change(entities)
        with self._lock:
            stored, _ = self._append_checked(
                session_id, turns, first_index, expires_at, key, entities
            )
            return stored

    def _append_checked(
        self,
        session_id: str,
        turns: Sequence[NewTurn],
        first_index: int | None,
        expires_at: datetime | None,
        key: str | None,
        entities: EntityChange | None,
        *,
        now: datetime | None = None,
    ) -> tuple[list[Turn], bool]:
        """:meth:`append_turns` after its argument checks, under the lock; also says
        whether the append was a recognised retry (its turns as first stored, if live).
        The turns' sizes are checked here, before anything changes. ``now``: the call's
        clock reading, if the caller took it from this store's clock."""
        if now is None:
            now = self._clock.now()
        header = self._header(session_id, now)
        if key is not None and header is not None and key in header.keys:
            start, count = header.keys[key]
            return self._live_range(session_id, start, start + count, now), True
        start = self._next.get(session_id, 0)
        if first_index is not None and first_index != start:
            raise ConflictError(
                f"session {session_id!r}: next archived turn index is {start}, not {first_index}",
                expected=first_index,
                actual=start,
            )
        indexed = _numbered(turns, start)
        for turn in indexed:
            _check_turn_size(turn)
        # Size check first too.
        merged = None if entities is None else self._merged_entities(session_id, entities)
        heap = self._by_lifetime
        if heap and heap[0][0] <= now:  # else collection finds nothing
            # It drops only dead sessions: ``header``, live at ``now``, stays as it is.
            self._collect_some(now)
        header = self._extend_header(session_id, header, expires_at)
        if merged is not None:
            # What _set_record stores, built when first read (_PendingEntities).
            members, sizes, version = merged
            self._pending_entities[session_id] = _PendingEntities(
                members, sizes, version + 1, now, header.lifetime
            )
            records = self._records.get(session_id)
            if records is not None:
                records.pop(ENTITIES_RECORD, None)
            self._entity_sizes.pop(session_id, None)
        if key is not None:
            header.keys[key] = (start, len(indexed))
        # get-then-create: ``setdefault(sid, {})`` builds two dicts per append to drop them.
        archive = self._turns.get(session_id)
        if archive is None:
            archive = self._turns[session_id] = {}
            expiry = self._turn_expiry[session_id] = {}
        else:
            expiry = self._turn_expiry[session_id]
        for turn in indexed:
            archive[turn.index] = turn
            expiry[turn.index] = expires_at
        self._next[session_id] = start + len(indexed)
        return indexed, False

    def _merged_entities(
        self, session_id: str, change: EntityChange | None
    ) -> tuple[dict[str, ActiveEntity | JsonValue], dict[str, int] | None, int] | None:
        """The ``entities`` record's members with ``change`` merged in (upserted entities
        as themselves: :class:`_PendingEntities`), the serialized size of each member, and
        the record's current version (0: none); None: no change.

        The record is held to :data:`MAX_RECORD_BYTES` as a whole, but only the upserted
        entities are measured, by arithmetic (:func:`_entity_member_size`): the other
        members' sizes are kept from the write that stored them, so a turn costs O(its
        changes), not O(the session's entities). Anything unusual (over the limit, text
        that is not UTF-8, a record written by ``put_record``) goes through
        :func:`encode_data` whole, which raises the contract's exact errors.
        """
        if change is None or (not change.upsert and not change.remove):
            return None
        # The caller looked the header up at this call's ``now``: a dead session's records
        # are dropped already.
        members: dict[str, ActiveEntity | JsonValue]
        sizes: dict[str, int] | None
        pending = self._pending_entities.get(session_id)
        if pending is not None:
            members = dict(pending.members)
            sizes = None if pending.sizes is None else dict(pending.sizes)
            version = pending.version
        else:
            current = self._records.get(session_id, {}).get(ENTITIES_RECORD)
            members = dict(current.data) if current is not None else {}
            cached = self._entity_sizes.get(session_id)
            if current is None:
                sizes = {}
            elif cached is not None and cached.record is current:
                sizes = dict(cached.sizes)
            else:  # written by put_record (or never measured): measure it once
                sizes = _member_sizes(members)
            version = 0 if current is None else current.version
        for kind in change.remove:
            members.pop(kind, None)
            if sizes is not None:
                sizes.pop(kind, None)
        for kind, entity in change.upsert.items():
            members[kind] = entity
            if sizes is not None:
                size = _entity_member_size(kind, entity)
                if size is None:
                    sizes = None
                else:
                    sizes[kind] = size
        if sizes is None or _object_size(sizes) > MAX_RECORD_BYTES:
            data = _entities_data(members)
            encode_data(data, what=f"record {ENTITIES_RECORD!r}")  # raises the exact error
            sizes = _member_sizes(data)
        return members, sizes, version

    def _record(self, session_id: str, kind: str) -> SessionRecord | None:
        """The session's record ``kind`` (the caller found its header live), an
        ``entities`` record the appends left pending built now, once."""
        if kind == ENTITIES_RECORD:
            pending = self._pending_entities.pop(session_id, None)
            if pending is not None:
                data = _entities_data(pending.members)
                values: dict[str, JsonValue] = {
                    "kind": kind,
                    "data": data,
                    "version": pending.version,
                    "updated_at": pending.updated_at,
                    "expires_at": pending.expires_at,
                }
                # As _set_record: validation only to bring a time that is not UTC to UTC.
                expires_at = pending.expires_at
                utc = pending.updated_at.tzinfo is UTC and (
                    expires_at is None or expires_at.tzinfo is UTC
                )
                record = SessionRecord.trusted(values) if utc else SessionRecord(**values)
                self._records.setdefault(session_id, {})[kind] = record
                if pending.sizes is not None:
                    self._entity_sizes[session_id] = _EntitySizes(record, pending.sizes)
                return record
        return self._records.get(session_id, {}).get(kind)

    def _set_record(
        self,
        session_id: str,
        kind: str,
        data: dict[str, JsonValue],
        header: _Header,
        now: datetime,
    ) -> SessionRecord:
        """Store a record one version up (the caller checked versions and extended the
        header in the same locked step)."""
        current = self._records.get(session_id, {}).get(kind)
        values: dict[str, JsonValue] = {
            "kind": kind,
            "data": data,
            "version": (current.version if current else 0) + 1,
            "updated_at": now,
            "expires_at": header.lifetime,
        }
        # Checked kind, the store's own data: validation would only normalise the times to
        # UTC, so it runs only when one is not UTC already (a caller's other timezone).
        utc = now.tzinfo is UTC and (header.lifetime is None or header.lifetime.tzinfo is UTC)
        record = SessionRecord.trusted(values) if utc else SessionRecord(**values)
        self._records.setdefault(session_id, {})[kind] = record
        return record

    async def next_index(self, session_id: str) -> int:
        validate_id(session_id, what="session_id")
        with self._lock:
            return self._next_index(session_id)

    def _live_range(
        self, session_id: str, start: int, end: int | None, now: datetime
    ) -> list[Turn]:
        """The session's live turns with ``start <= index < end``, by index: O(the range),
        not O(the session) (the summary passes read a few recent turns of long sessions)."""
        archive = self._turns.get(session_id)
        if not archive:
            return []
        expiry = self._turn_expiry[session_id]
        stop = self._next_index(session_id)  # above every archived index
        if end is not None and end < stop:
            stop = end
        if stop - start > len(archive):  # collected turns leave gaps: walk what is held
            return [
                archive[i] for i in sorted(archive) if start <= i < stop and is_live(expiry[i], now)
            ]
        found: list[Turn] = []
        for i in range(start, stop):
            turn = archive.get(i)
            if turn is not None and is_live(expiry[i], now):
                found.append(turn)
        return found

    def _live_tail(self, session_id: str, count: int, now: datetime) -> list[Turn]:
        """The session's last ``count`` live turns, by index, read from the newest back."""
        archive = self._turns.get(session_id)
        if not archive or count <= 0:
            return []
        expiry = self._turn_expiry[session_id]
        held = len(archive)
        top = self._next_index(session_id)
        if top > 2 * held + count:  # mostly gaps (collected turns): walk what is held
            live = [i for i in sorted(archive) if is_live(expiry[i], now)]
            return [archive[i] for i in live[-count:]]
        found: list[Turn] = []
        seen = 0
        for i in range(top - 1, -1, -1):
            turn = archive.get(i)
            if turn is None:
                continue
            seen += 1
            if is_live(expiry[i], now):
                found.append(turn)
                if len(found) == count:
                    break
            if seen == held:
                break
        found.reverse()
        return found

    async def get_turn(self, session_id: str, index: int) -> Turn:
        validate_id(session_id, what="session_id")
        check_index(index)
        with self._lock:  # one entry, not the session's visible map (O(1), not O(turns))
            turn = self._turns.get(session_id, {}).get(index)
            expires_at = self._turn_expiry[session_id][index] if turn is not None else None
        if turn is None or not is_live(expires_at, self._clock.now()):
            raise NotFoundError(f"session {session_id!r} has no turn {index}")
        return turn

    async def get_turns(
        self, session_id: str, start: int = 0, end: int | None = None
    ) -> list[Turn]:
        validate_id(session_id, what="session_id")
        check_range(start, end)
        with self._lock:
            return self._live_range(session_id, start, end, self._clock.now())

    async def tail_turns(self, session_id: str, count: int) -> list[Turn]:
        validate_id(session_id, what="session_id")
        if count < 0:
            raise ValidationError(f"count must be >= 0, got {count}")
        with self._lock:
            return self._live_tail(session_id, count, self._clock.now())

    async def redact_turn(self, session_id: str, index: int) -> Turn:
        turn = await self.get_turn(session_id, index)
        redacted = turn.redact()
        with self._lock:
            archive = self._turns[session_id]
            if index in archive:  # not collected meanwhile
                archive[index] = redacted
        return redacted

    # -- sessions -----------------------------------------------------------------------

    async def register_session(
        self, ref: SessionRef, *, expires_at: datetime | None = None
    ) -> SessionRef:
        validate_id(ref.session_id, what="session_id")
        validate_id(ref.user_id, what="user_id")
        check_aware(expires_at, what="expires_at")
        with self._lock:
            now = self._clock.now()
            header = self._header(ref.session_id, now)
            holder = header.owner if header is not None else None
            if holder is not None and holder.user_id != ref.user_id:
                return holder
            header = self._extend(ref.session_id, expires_at, now)
            if holder is None:
                # A previous owner whose session died leaves its list entry behind (lists
                # are the user's history); the id now belongs to ``ref.user_id``.
                header.owner = holder = ref
            self._users.setdefault(ref.user_id, {}).setdefault(ref.session_id, holder)
            return holder

    async def get_session(self, session_id: str) -> SessionRef | None:
        validate_id(session_id, what="session_id")
        with self._lock:
            header = self._header(session_id, self._clock.now())
            return header.owner if header is not None else None

    async def list_sessions(self, user_id: str, *, limit: int = 100) -> list[SessionRef]:
        validate_id(user_id, what="user_id")
        check_limit(limit)
        with self._lock:
            refs = list(self._users.get(user_id, {}).values())
        refs.sort(key=lambda r: (r.created_at, r.session_id), reverse=True)
        return refs[:limit]

    async def get_record(self, session_id: str, kind: str) -> SessionRecord | None:
        validate_id(session_id, what="session_id")
        check_kind(kind)
        with self._lock:
            if self._header(session_id, self._clock.now()) is None:
                return None
            return self._record(session_id, kind)

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
        check_aware(expires_at, what="expires_at")
        copy = _json_copy(data, encode_data(data, what=f"record {kind!r}"))
        with self._lock:
            now = self._clock.now()
            # What get_record would return, without its argument checks (done above).
            current = (
                self._record(session_id, kind)
                if self._header(session_id, now) is not None
                else None
            )
            actual = current.version if current else 0
            if expected_version is not None and expected_version != actual:
                raise ConflictError(
                    f"record {kind!r} of session {session_id!r} is at version {actual}, "
                    f"not {expected_version}; re-read it and retry",
                    expected=expected_version,
                    actual=actual,
                )
            header = self._extend(session_id, expires_at, now)
            return self._set_record(session_id, kind, copy, header, now)

    async def delete_session(self, session_id: str) -> None:
        validate_id(session_id, what="session_id")
        with self._lock:
            self._drop(session_id)
            for refs in self._users.values():
                refs.pop(session_id, None)

    # -- long-term memory -------------------------------------------------------------

    async def put_memory(
        self, record: MemoryRecord, *, expected_version: int | None = None
    ) -> MemoryRecord:
        encode_memory(record)
        check_memory_version(record, expected_version)
        with self._lock:
            current = await self.get_memory(record.user_id, record.memory_id)
            actual = current.version if current else 0
            if expected_version is not None and expected_version != actual:
                raise ConflictError(
                    f"memory {record.memory_id!r} is at version {actual}, "
                    f"not {expected_version}; re-read it and retry",
                    expected=expected_version,
                    actual=actual,
                )
            self._memories.setdefault(record.user_id, {})[record.memory_id] = record
            return record

    async def get_memory(self, user_id: str, memory_id: str) -> MemoryRecord | None:
        validate_id(user_id, what="user_id")
        validate_id(memory_id, what="memory_id")
        with self._lock:
            record = self._memories.get(user_id, {}).get(memory_id)
        if record is None or not is_live(record.expires_at, self._clock.now()):
            return None
        return record

    async def get_memories(
        self, user_id: str, memory_ids: Collection[str]
    ) -> dict[str, MemoryRecord]:
        ids = check_memory_ids(user_id, memory_ids)
        now = self._clock.now()
        with self._lock:
            stored = self._memories.get(user_id, {})
            found = {i: record for i in ids if (record := stored.get(i)) is not None}
        return {i: record for i, record in found.items() if is_live(record.expires_at, now)}

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
        check_limit(limit)
        check_aware(since, what="since")
        check_aware(until, what="until")
        now = self._clock.now()
        with self._lock:
            records = list(self._memories.get(user_id, {}).values())
        selected = [
            r
            for r in records
            if (memory_types is None or r.memory_type in memory_types)
            and (since is None or r.created_at >= since)
            and (until is None or r.created_at < until)
            and (include_expired or is_live(r.expires_at, now))
        ]
        selected.sort(key=lambda r: (r.created_at, r.memory_id), reverse=True)
        return selected[:limit]

    async def delete_memory(self, user_id: str, memory_id: str) -> bool:
        validate_id(user_id, what="user_id")
        validate_id(memory_id, what="memory_id")
        with self._lock:
            return self._memories.get(user_id, {}).pop(memory_id, None) is not None

    async def purge_user(self, user_id: str) -> int:
        validate_id(user_id, what="user_id")
        with self._lock:
            sessions = self._users.pop(user_id, {})
            for session_id in sessions:
                header = self._headers.get(session_id)
                if header is None or header.owner is None or header.owner.user_id == user_id:
                    self._drop(session_id)
            memories = self._memories.pop(user_id, {})
            return len(sessions) + len(memories)

    async def aclose(self) -> None:
        return None


_ENTITY_FIELDS = ("kind", "value", "turn_index", "updated_at")
_ENTITY_FAST = tuple(ActiveEntity.model_fields) == _ENTITY_FIELDS
"""Whether :func:`_entity_member_size` may measure the usual entity itself (the model has
exactly these fields, in this order)."""


def _usual_entity(entity: ActiveEntity) -> tuple[str, str, int | None, datetime] | None:
    """The kind, value, turn index and time of the usual entity (an exact
    :class:`ActiveEntity` of plain strings, an int or no turn index, a UTC time), which
    :func:`_entity_member_size` measures without dumping it; None for anything else."""
    values = entity.__dict__
    kind, value = values.get("kind"), values.get("value")
    turn_index, updated_at = values.get("turn_index"), values.get("updated_at")
    if (
        _ENTITY_FAST
        and type(entity) is ActiveEntity
        and type(kind) is str
        and type(value) is str
        and (turn_index is None or type(turn_index) is int)
        and type(updated_at) is datetime
        and updated_at.tzinfo is UTC
    ):
        return kind, value, turn_index, updated_at
    return None


def _entity_json(entity: ActiveEntity) -> dict[str, JsonValue]:
    """``entity.model_dump(mode="json")``. (A hand-built dict of the usual entity, as
    :func:`_entity_member_size` measures it, was slower: ~2.2 µs against pydantic's ~1.7,
    the ``isoformat`` and the checks costing more than the serializer they replaced.)"""
    dumped: dict[str, JsonValue] = entity.model_dump(mode="json")
    return dumped


def _entities_data(members: Mapping[str, ActiveEntity | JsonValue]) -> dict[str, JsonValue]:
    """The ``entities`` record's data of pending members (:class:`_PendingEntities`):
    each entity dumped as :func:`_entity_json` dumps it, other values (from a stored
    record's data) as they are."""
    return {
        kind: _entity_json(value) if isinstance(value, ActiveEntity) else value
        for kind, value in members.items()
    }


_ENTITY_KEYS_SIZE = sum(len(key) + 2 for key in _ENTITY_FIELDS) + 2 + len(_ENTITY_FIELDS) * 2 - 1
"""Bytes of a dumped entity's object beyond its values: the four keys in quotes, the
braces, a colon per member and the commas between them."""


def _entity_member_size(kind: str, entity: ActiveEntity) -> int | None:
    """:func:`_member_size` of ``kind`` and ``_entity_json(entity)``, without dumping the
    usual entity (plain strings, a UTC time): its ``updated_at`` is written as 20
    characters, or 27 with microseconds (``2026-01-01T00:00:00.000001Z``), and the rest
    is measured as :func:`_member_size` measures it. None as :func:`_member_size`."""
    usual = _usual_entity(entity)
    if usual is not None:
        own_kind, value, turn_index, updated_at = usual
        key = _string_size(kind)
        kind_size = _string_size(own_kind)
        text = _string_size(value)
        number = 4 if turn_index is None else _int_size(turn_index)
        if key >= 0 and kind_size >= 0 and text >= 0 and number >= 0:
            stamp = 29 if updated_at.microsecond else 22  # with its quotes
            return key + 1 + _ENTITY_KEYS_SIZE + kind_size + text + number + stamp
    return _member_size(kind, _entity_json(entity))


_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})
"""Types whose values a JSON round trip gives back equal and of the same type (a float
through its ``repr``, which round-trips exactly; ``encode_data`` refuses NaN and the
infinities). They are immutable, so a copy may share them."""


class _UnusualJsonError(Exception):
    """A value :func:`_json_copy` leaves to the JSON round trip (a subclass, a key that is
    not a string)."""


def _json_copy(data: Mapping[str, JsonValue], payload: str) -> dict[str, JsonValue]:
    """What ``json.loads(payload)`` returns, ``payload`` being ``encode_data(data)``,
    without parsing it: every dict and list is a new one (a tuple becomes a list, as JSON
    makes it), scalars of :data:`_JSON_SCALARS` are shared. Anything else (a ``str`` or
    ``int`` subclass, a key JSON would turn into a string) takes the round trip.

    Why: a stored record must not alias the caller's containers, and parsing the text just
    written cost a pass more than copying what it was written from (issue #8)."""
    try:
        copy = _copy_json_value(data)
    except (_UnusualJsonError, RecursionError):  # the C encoder nests deeper than Python frames
        loaded: dict[str, JsonValue] = json.loads(payload)
        return loaded
    assert type(copy) is dict  # encode_data accepted a mapping, and only a dict encodes
    return copy


def _copy_json_value(value: Mapping[str, JsonValue] | JsonValue) -> JsonValue:
    kind = type(value)
    if kind is dict:
        out: dict[str, JsonValue] = {}
        for key, item in cast("dict[object, JsonValue]", value).items():
            if type(key) is not str:
                raise _UnusualJsonError
            out[key] = item if type(item) in _JSON_SCALARS else _copy_json_value(item)
        return out
    if kind is list or kind is tuple:
        return [
            item if type(item) in _JSON_SCALARS else _copy_json_value(item)
            for item in cast("Sequence[JsonValue]", value)
        ]
    if kind in _JSON_SCALARS:
        return cast("JsonValue", value)
    raise _UnusualJsonError


def _hot_result(turns: list[Turn], version: int) -> HotAppendResult:
    """What a hot append that wrote ``turns`` (numbered, the last one the session's last)
    and reached ``version`` returns."""
    return HotAppendResult.trusted(
        {"turns": tuple(turns), "version": version, "next_index": turns[-1].index + 1}
    )


def _member_size(kind: str, value: JsonValue) -> int | None:
    """UTF-8 bytes of ``"kind":value`` as :func:`encode_data` writes it inside an object;
    None if it cannot be written (the caller lets :func:`encode_data` say why).

    An entity (a flat object of plain strings and numbers) is measured by arithmetic,
    exact for what it accepts; anything else is serialized."""
    key = _string_size(kind)
    size = _flat_size(value) if key >= 0 else -1
    if size >= 0:
        return key + 1 + size
    try:
        member = json.dumps(
            {kind: value}, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        )
        return len(member.encode()) - 2  # without the braces
    except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError
        return None


_NEEDS_ESCAPE = re.compile(r'[\x00-\x1f"\\]')
"""What ``json.dumps(ensure_ascii=False)`` escapes in a string."""


def _string_size(text: str) -> int:
    """UTF-8 bytes of ``text`` as a JSON string, quotes included, if it needs no escape;
    -1 otherwise (or if it is not encodable)."""
    if type(text) is not str:
        return -1
    if text.isascii():
        # isprintable() also refuses DEL, which needs no escape: measured the slow way.
        ok = text.isprintable() and '"' not in text and "\\" not in text
        return len(text) + 2 if ok else -1
    if _NEEDS_ESCAPE.search(text):
        return -1
    try:
        return len(text.encode()) + 2
    except UnicodeEncodeError:
        return -1


def _scalar_size(value: JsonValue) -> int:
    """Bytes of a string, int, float, bool or None in JSON; -1 for anything else."""
    kind = type(value)
    if kind is str:
        return _string_size(value)
    if kind is int:
        return _int_size(value)
    if kind is bool:
        return 4 if value else 5
    if value is None:
        return 4
    if kind is float and math.isfinite(value):
        return len(repr(value))  # what json writes: float.__repr__
    return -1


def _int_size(value: int) -> int:
    """Digits (and sign) of an int in JSON; -1 past Python's limit on int-to-text
    conversion, where json cannot write it either (the caller serializes it and says so)."""
    try:
        return len(repr(value))
    except ValueError:
        return -1


def _flat_size(value: JsonValue) -> int:
    """Bytes of a scalar, or of an object of scalars under string keys, as compact JSON;
    -1 for anything else (the caller serializes it)."""
    if type(value) is not dict:
        return _scalar_size(value)
    if not value:
        return 2
    # Braces, a colon per member and a comma between members.
    total = 2 * len(value) + 1
    strings: list[str] = []
    for key, item in value.items():
        if type(key) is not str:
            return -1
        strings.append(key)
        kind = type(item)
        if kind is str:
            strings.append(item)
        elif kind is int:
            item_size = _int_size(item)
            if item_size < 0:
                return -1
            total += item_size
        else:
            item_size = _scalar_size(item)
            if item_size < 0:
                return -1
            total += item_size
    # The usual strings, tested at once (this runs on every entity change): printable ASCII
    # without quotes or backslashes is written as it is, in quotes. Else one by one.
    text = "".join(strings)
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return total + len(text) + 2 * len(strings)
    for string in strings:
        size = _string_size(string)
        if size < 0:
            return -1
        total += size
    return total


def _member_sizes(data: Mapping[str, JsonValue]) -> dict[str, int] | None:
    """:func:`_member_size` of every member, or None if one cannot be written."""
    sizes: dict[str, int] = {}
    for kind, value in data.items():
        size = _member_size(kind, value)
        if size is None:
            return None
        sizes[kind] = size
    return sizes


def _object_size(sizes: Mapping[str, int]) -> int:
    """UTF-8 bytes of the compact JSON object whose members have ``sizes``."""
    return 2 + sum(sizes.values()) + max(len(sizes) - 1, 0)


def _check_change(change: EntityChange | None) -> None:
    """Validate an entity change's kinds before anything is written."""
    if change is None:
        return
    if not isinstance(change, EntityChange):
        raise ValidationError(f"entities takes an EntityChange, got {type(change).__name__}")
    for kind in [*change.upsert, *change.remove]:
        check_kind(kind, what="entity kind")


_SMALL_TEXT = MAX_TURN_BYTES // 8
"""Text of at most this many characters surely fits a turn: JSON writes a character in at
most 6 bytes (``\\u001f``), which leaves room for everything else of a plain turn."""


def _numbered(turns: Sequence[NewTurn], start: int) -> list[Turn]:
    """``turns`` with indexes from ``start``; a turn that already has its index (the hot
    copy of an archived turn) is kept as it is."""
    if len(turns) == 1:  # most appends: no comprehension frame
        turn = turns[0]
        return [turn if type(turn) is Turn and turn.index == start else turn.with_index(start)]
    return [
        turn if type(turn) is Turn and turn.index == start + i else turn.with_index(start + i)
        for i, turn in enumerate(turns)
    ]


def _check_turn_size(turn: Turn) -> None:
    """The contract's size limit (and UTF-8 check), without serializing the common turn:
    plain text blocks and flat metadata, whose JSON size is bounded by their characters.
    Anything else is serialized, which raises what the contract says."""
    content = turn.content
    strings: list[str]
    if len(content) == 1 and type(content[0]) is TextBlock:  # most turns: one text block
        strings = [content[0].text]
    else:
        strings = [block.text for block in content if type(block) is TextBlock]
        if len(strings) != len(content):
            encode_turn(turn)
            return
    numbers = 0
    metadata = turn.metadata
    if metadata:
        for key, value in metadata.items():
            if type(key) is not str:
                encode_turn(turn)
                return
            strings.append(key)
            if type(value) is str or isinstance(value, str):
                strings.append(value)
            elif isinstance(value, int | float | bool | None):
                numbers += 1
            else:
                encode_turn(turn)
                return
    for entity in turn.entities:
        strings.append(entity.kind)
        strings.append(entity.value)
    agent_name, intent = turn.agent_name, turn.intent
    if agent_name:
        strings.append(agent_name)
    if intent:
        strings.append(intent)
    # One string to measure and test: Python's UTF-8 codec refuses every surrogate,
    # paired or not, so joining cannot hide a lone one.
    text = "".join(strings)
    if len(text) + 32 * numbers > _SMALL_TEXT or not (text.isascii() or _utf8(text)):
        encode_turn(turn)


def _utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
