"""The storage contract: what a backend must do, shaped by the domain.

Two roles, each a small :class:`~typing.Protocol`:

* :class:`HotStore` — the per-session hot tier: a bounded window of recent turns, session
  metadata, active entities and named state blobs, all under one logical expiry. Appending
  turns (with window cap, metadata, expiry and version check) is one atomic operation;
  loading a session snapshot is one read.
* :class:`DurableStore` — the durable tier: the turn archive (every turn, addressable by
  index), versioned session records (summaries, structured memory, watermarks), the list of
  a user's sessions, and long-term memory records.

Every backend in :mod:`tiermem.store.backends` implements both roles, and the conformance
suite in :mod:`tiermem.testing` checks all of them with the same tests.

Rules every implementation follows:

* **Ids** are validated with :func:`tiermem.store.keys.validate_id` before any I/O, and
  escaped with :func:`~tiermem.store.keys.escape_segment` wherever they become part of a key.
* **Logical expiry**: every read filters on ``expires_at`` using the store's injected
  clock. A native TTL (Redis PEXPIRE, DynamoDB TTL attribute) is set as well, but only to
  collect garbage: it is ``expires_at - now + gc_grace``, so it never fires before the
  logical expiry even when the clock is a test's fake clock.
* **Versions**: conditional writes raise :class:`~tiermem.errors.ConflictError` carrying
  ``expected`` and ``actual``; a failed write changes nothing.
* **Turn indexes** are session-scoped, start at 0 and are gap-free, even with concurrent
  appenders: the store allocates them atomically.
* **A durable session's lifetime** is the latest ``expires_at`` any of its writes gave
  (:meth:`DurableStore.register_session`, :meth:`~DurableStore.append_turns`,
  :meth:`~DurableStore.put_record`; None means forever), raised in the same atomic write,
  never lowered. While the session lives, its owner (the user it was registered to), its
  records and its idempotency keys are readable: nothing of a session outlives its
  ownership. Each turn expires on its own, at the ``expires_at`` of its append (which is
  never after the session's lifetime). Once the lifetime has passed the session reads as
  absent everywhere; the id may then be registered again, by anyone.
* **Sizes**: a turn, a session record or a memory record of up to the limits below
  (serialized as JSON) round-trips on every backend; larger ones raise
  :class:`~tiermem.errors.ValidationError` before anything is written.
* **Errors** of the backend's client library are mapped to
  :class:`~tiermem.errors.BackendError` subclasses at the boundary.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Protocol, runtime_checkable

from pydantic import Field

from tiermem.errors import ValidationError
from tiermem.models import (
    ActiveEntity,
    FrozenModel,
    JsonValue,
    MemoryRecord,
    NewTurn,
    SessionMetadata,
    SessionRecord,
    SessionRef,
    SessionSnapshot,
    StateBlob,
    Turn,
)

__all__ = [
    "DEFAULT_GC_GRACE",
    "ENTITIES_RECORD",
    "MAX_MEMORY_BYTES",
    "MAX_MEMORY_IDS_PER_GET",
    "MAX_RECORD_BYTES",
    "MAX_SHARED_BYTES",
    "MAX_TURNS_PER_APPEND",
    "MAX_TURN_BYTES",
    "BuiltAppend",
    "Capability",
    "CombinedAppend",
    "CombinedRead",
    "DurableStore",
    "EntityChange",
    "HotAppendResult",
    "HotStore",
    "InProcessAppend",
    "InProcessRead",
    "check_size",
]

MAX_TURN_BYTES = 1024 * 1024
"""Largest turn (JSON) a backend must store; DynamoDB compresses and splits to fit 400 KB items."""
MAX_RECORD_BYTES = 1024 * 1024
"""Largest session record or state blob (JSON)."""
MAX_SHARED_BYTES = 64 * 1024
"""Largest shared blob (JSON): shared state is small (breakers, counters), and one
DynamoDB item must hold it."""
MAX_MEMORY_BYTES = 256 * 1024
"""Largest long-term memory record (JSON)."""
MAX_MEMORY_IDS_PER_GET = 1000
"""Most ids one :meth:`DurableStore.get_memories` may ask for (duplicates count); callers
with more split the list. It bounds one call's work: 10 DynamoDB BatchGetItem requests,
2 SQLite statements, one Redis HMGET."""
MAX_TURNS_PER_APPEND = 50
"""Most turns one append may carry. DynamoDB transactions hold 100 items and 4 MB, with room
needed for the session counter and for parts of split turns; larger batches are split by
the caller (the session API does it)."""
DEFAULT_GC_GRACE = timedelta(hours=1)
"""How long after logical expiry native TTLs let data linger before collecting it."""


def check_size(payload: bytes | str, *, limit: int, what: str) -> None:
    """Raise :class:`ValidationError` if a serialized payload is over its limit."""
    try:
        size = len(payload.encode() if isinstance(payload, str) else payload)
    except UnicodeEncodeError as exc:
        raise ValidationError(
            f"{what} holds text that cannot be stored as UTF-8 (a lone surrogate at "
            f"position {exc.start}); decode your input with errors='replace'"
        ) from exc
    if size > limit:
        raise ValidationError(
            f"{what} is {size} bytes serialized; the limit is {limit}. "
            "Store large tool outputs or documents by reference (an S3 uri or a document id) "
            "instead of inline."
        )


class Capability(StrEnum):
    """What a backend declares it can do, so callers never probe by catching errors."""

    PERSISTENT = "persistent"
    """Data survives a restart of the process."""
    NATIVE_TTL = "native_ttl"
    """Expired data is collected by the backend itself."""
    CLUSTER_SAFE = "cluster_safe"
    """All keys of one session live on one shard (Redis Cluster hash tags)."""
    FULL_TEXT_SEARCH = "full_text_search"
    """The backend keeps a full-text index over memory content."""
    ENTITIES_IN_APPEND = "entities_in_append"
    """``append_turns`` takes ``entities=`` (an :class:`EntityChange`) and writes it in the
    same atomic write as the turns. Without it, callers write entity changes separately
    (``update_entities`` / a compare-and-set of the ``entities`` record)."""
    KEEP_EXPIRED = "keep_expired"
    """``HotStore.append_turns`` takes ``keep_expired=`` (refuses to start afresh over an
    expired session it still holds). Write-behind passes it only to stores declaring it:
    over another store an append after an expiry, before a sweep, starts the session
    afresh (its turns not flushed yet are lost), as before the flag existed."""
    OPTIMISTIC_APPEND = "optimistic_append"
    """``DurableStore.append_turns`` with ``first_index`` saves the store a read of the
    session's counter (DynamoDB: a GetItem before the transaction; SQLite: a statement
    of the append's transaction): callers that know the next index (a session handle's
    counter) pass it and re-read only on ConflictError."""


class EntityChange(FrozenModel):
    """Active entities an append sets (keyed by kind) and removes, merged into the session's
    entities in the same atomic write as the turns (see ``append_turns``): a merge, so
    concurrent changes of different kinds never lose each other.

    Merge order: ``remove`` first, then ``upsert`` (a kind in both ends up set). The
    entities' ``turn_index`` values are stored as given: a caller whose change refers to
    the appended turns pins ``first_index`` so that the indexes it wrote are the ones
    allocated (on :class:`~tiermem.errors.ConflictError` it re-reads and retries).
    An empty change (``EntityChange()``) writes nothing beyond the turns.
    """

    upsert: dict[str, ActiveEntity] = Field(default_factory=dict)
    remove: tuple[str, ...] = ()


class HotAppendResult(FrozenModel):
    """What :meth:`HotStore.append_turns` wrote."""

    turns: tuple[Turn, ...]
    version: int
    next_index: int


ENTITIES_RECORD = "entities"
"""The durable record kind holding a session's active entities."""


@runtime_checkable
class HotStore(Protocol):
    """The hot tier of sessions.

    A session exists in the hot tier from its first write until its ``expires_at``; every
    write sets ``expires_at`` for the whole session (turns, metadata, entities, state) and
    records it in the activity index. After ``expires_at`` the session reads as absent, and
    the next write starts it afresh (version 0, no turns), unless an append asks to keep
    it (``keep_expired``). Until the backend collects it (at least ``gc_grace`` after its
    expiry) an expired session is *held*: :meth:`load` with ``include_expired`` returns it.

    ``version`` counts successful writes to the session: each write adds exactly 1.
    """

    name: str
    capabilities: frozenset[Capability]

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
        """Append turns, keep only the last ``window`` of them, and set the expiry — atomically.

        ``entities``, when given, is merged into the session's active entities in the same
        write (same semantics as :meth:`update_entities`; the version still grows by 1).
        Only stores declaring :attr:`Capability.ENTITIES_IN_APPEND` accept it; a failed
        append (conflict, size) writes neither the turns nor the entities.

        Indexes are allocated from the session's ``next_index``. ``first_index`` pins them:
        on an absent session it sets where numbering starts (a reload after expiry continues
        the archive's numbering); on a live session it must equal ``next_index``.
        ``metadata``, when given, replaces the session's metadata in the same write.

        ``keep_expired`` (only stores declaring :attr:`Capability.KEEP_EXPIRED` take
        it): an expired session the store still holds (the one
        ``load(include_expired=True)`` would return) is not started afresh over: nothing is
        written and ConflictError raised (``expected`` None, ``actual`` its version), so
        that the caller can save what only it holds first (write-behind turns not flushed
        yet). Checked before ``expected_version`` and ``first_index``. A live or absent
        (collected) session is appended to as without it.

        Raises:
            ValidationError: empty or oversized ``turns``, more than
                :data:`MAX_TURNS_PER_APPEND`, ``window`` < 1, or a bad id.
            ConflictError: ``expected_version`` (0 = the session must be absent) or
                ``first_index`` does not match, or ``keep_expired`` and the session is
                expired but held; nothing was written.
        """
        ...

    async def load(
        self, session_id: str, *, include_expired: bool = False
    ) -> SessionSnapshot | None:
        """The whole hot session in one read, or None if it is absent or expired.

        With ``include_expired`` a session past its expiry is still returned until the
        backend collects it (at least ``gc_grace`` after expiry): the expiry sweeper uses
        this to flush write-behind turns and hand the session off.
        """
        ...

    async def put_metadata(
        self,
        session_id: str,
        metadata: SessionMetadata,
        *,
        expires_at: datetime,
        expected_version: int | None = None,
    ) -> int:
        """Replace the session's metadata; returns the new session version.

        Raises:
            ConflictError: ``expected_version`` does not match the session's version.
        """
        ...

    async def update_entities(
        self,
        session_id: str,
        upsert: Mapping[str, ActiveEntity],
        remove: Collection[str] = (),
        *,
        expires_at: datetime,
    ) -> int | None:
        """Set some active entities (keyed by kind) and remove others; returns the new version.

        A merge, not a replacement: concurrent updates of different kinds never lose each
        other. Removing a kind that is not there is not an error. On an absent or expired
        session nothing is written and None is returned: entities never start a session
        (a half-built hot session would hide the durable tier's copy from readers).
        """
        ...

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
        """Replace everything the hot tier holds for the session, atomically; returns the new
        version (previous version, 0 if absent or expired, + 1).

        ``turns`` are already indexed (the durable tier's), consecutive and below
        ``next_index``; the last ``window`` are kept. State blobs keep their own versions and
        ``updated_at``: a reload never restarts a compare-and-set sequence. ``expected_version``
        None replaces unconditionally, 0 requires the session to be absent or expired, n
        requires version n.

        Raises:
            ValidationError: turns not consecutive or not below ``next_index``, ``window``
                < 1, oversized data, or a bad id.
            ConflictError: ``expected_version`` does not match; nothing was written.
        """
        ...

    async def get_state(self, session_id: str, name: str) -> StateBlob | None:
        """One named state blob, or None."""
        ...

    async def put_state(
        self,
        session_id: str,
        name: str,
        data: Mapping[str, JsonValue],
        *,
        expires_at: datetime,
        expected_version: int | None = None,
    ) -> StateBlob:
        """Write a named state blob, compare-and-set on its own version.

        ``expected_version`` None writes unconditionally; 0 requires the blob to be absent;
        n requires its version to be n. The written blob has version (previous or 0) + 1.

        Raises:
            ConflictError: the blob's version is not ``expected_version``.
            ValidationError: the blob is over :data:`MAX_RECORD_BYTES` or not JSON.
        """
        ...

    async def copy_state(self, session_id: str, blob: StateBlob, *, expires_at: datetime) -> bool:
        """Copy a blob whose version another tier allocated, keeping its version and
        ``updated_at``, unless the session holds that blob at the same or a newer version.

        Returns True if it was written (the session's version grows by 1). An absent or
        expired session is left absent and False returned.
        """
        ...

    async def touch(self, session_id: str, *, expires_at: datetime) -> bool:
        """Move the session's expiry; False (and nothing written) if it is absent or expired.

        Touching does not change the session's version.
        """
        ...

    async def delete(self, session_id: str) -> None:
        """Remove the session and its activity-index entry. Deleting nothing is not an error."""
        ...

    async def claim_expired(self, *, owner: str, lease: timedelta, limit: int = 100) -> list[str]:
        """Claim up to ``limit`` sessions whose expiry has passed, for handoff.

        A claimed session is leased to ``owner`` until now + ``lease``; while the lease runs,
        no other claimer gets it. When the lease runs out (the owner crashed), the session can
        be claimed again. Any write or touch of the session clears its lease.
        """
        ...

    # -- shared keyspace: state that belongs to no session (circuit breakers) ------------

    async def get_shared(self, name: str) -> StateBlob | None:
        """A named blob shared by every worker (not per session), or None if it is absent
        or expired. One round trip."""
        ...

    async def put_shared(
        self,
        name: str,
        data: Mapping[str, JsonValue],
        *,
        expires_at: datetime | None,
        expected_version: int | None = None,
    ) -> StateBlob:
        """Write a shared blob, compare-and-set on its version; one round trip.

        ``expected_version`` None writes unconditionally; 0 requires the blob to be absent
        or expired; n requires version n. The written blob has version (previous live
        version, or 0) + 1 and ``updated_at`` = the store's clock. ``expires_at`` None keeps
        it until it is overwritten or deleted; a native TTL collects it ``gc_grace`` after.

        Raises:
            ConflictError: the blob's version is not ``expected_version``; nothing written.
            ValidationError: a bad name (names follow the rules of ids) or data over
                :data:`MAX_SHARED_BYTES` or not JSON.
        """
        ...

    async def delete_shared(self, name: str) -> bool:
        """Delete a shared blob; False if there was none (or it had expired)."""
        ...

    async def release_expired(self, session_id: str, *, owner: str) -> bool:
        """Drop a claimed session from the activity index once its handoff is done.

        Returns False (and changes nothing) if ``owner`` no longer holds the lease, e.g.
        because the user came back and wrote to the session after it was claimed.
        """
        ...

    async def aclose(self) -> None:
        """Release connections. The store is not used afterwards."""
        ...


@runtime_checkable
class DurableStore(Protocol):
    """The durable tier: turn archive, session records, user sessions, long-term memory."""

    name: str
    capabilities: frozenset[Capability]

    # -- turn archive -----------------------------------------------------------------

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
        """Archive turns with the next consecutive indexes, atomically.

        ``entities``, when given, is merged into the session's ``entities`` record
        (:data:`ENTITIES_RECORD`: kind → ``ActiveEntity`` JSON) in the same atomic write,
        whose version grows by 1 -- so an entity change costs no extra round trip. A retry
        recognised by its ``idempotency_key`` applies nothing (its ``first_index`` is not
        checked either: it returns the turns the first attempt stored). Only stores
        declaring :attr:`Capability.ENTITIES_IN_APPEND` accept it; a failed append
        (conflict, size) writes neither the turns nor the entities.

        ``first_index``, when given, must equal the archive's next index (the hot tier
        allocated it). ``expires_at`` is the retention of these turns (None: forever); the
        same write raises the session's lifetime to at least it (module docstring).

        ``idempotency_key`` (an id: see :func:`~tiermem.store.keys.validate_id`) makes a
        retry safe: if an earlier append of this session used the same key and the
        session still lives, nothing is written and the turns that append stored are
        returned (as they are stored now), whatever ``turns`` and ``first_index`` say. The
        key is recorded in the same atomic write as the turns and remembered as long as
        the session lives.

        Raises:
            ValidationError: empty or oversized ``turns``, more than
                :data:`MAX_TURNS_PER_APPEND`, or a bad id or key.
            ConflictError: ``first_index`` is not the next index; nothing was written.
        """
        ...

    async def next_index(self, session_id: str) -> int:
        """The index the next archived turn will get (0 for a new session).

        After a session's lifetime has passed it is either 0 or where it was: a backend
        may collect the counter with the rest of the session.
        """
        ...

    async def get_turn(self, session_id: str, index: int) -> Turn:
        """One archived turn.

        Raises:
            NotFoundError: no turn has that index, or it has expired.
        """
        ...

    async def get_turns(
        self, session_id: str, start: int = 0, end: int | None = None
    ) -> list[Turn]:
        """Archived turns with ``start <= index < end`` (``end`` None: to the last), in order."""
        ...

    async def tail_turns(self, session_id: str, count: int) -> list[Turn]:
        """The last ``count`` archived turns, oldest first."""
        ...

    async def redact_turn(self, session_id: str, index: int) -> Turn:
        """Replace a turn's content with a redaction marker; the slot keeps its index.

        Raises:
            NotFoundError: no turn has that index.
        """
        ...

    # -- sessions ---------------------------------------------------------------------

    async def register_session(
        self, ref: SessionRef, *, expires_at: datetime | None = None
    ) -> SessionRef:
        """Claim the session id for ``ref.user_id`` and add it to that user's list, atomically.

        Returns the registration that holds: ``ref`` if the id was free (never registered,
        or its lifetime has passed), else the existing one, unchanged; the caller compares
        ``user_id`` to know whether it is the owner. A registration by the owner again
        extends the lifetime to at least ``expires_at``; one by another user writes nothing
        (it is not added to that user's list).
        """
        ...

    async def get_session(self, session_id: str) -> SessionRef | None:
        """The session's registration (its owner) while the session lives, else None."""
        ...

    async def list_sessions(self, user_id: str, *, limit: int = 100) -> list[SessionRef]:
        """A user's sessions, newest first."""
        ...

    async def get_record(self, session_id: str, kind: str) -> SessionRecord | None:
        """A versioned session record (``summary``, ``structured``, ``watermarks``...), or None.

        A record lives as long as its session (module docstring), however long ago it was
        written.
        """
        ...

    async def put_record(
        self,
        session_id: str,
        kind: str,
        data: Mapping[str, JsonValue],
        *,
        expected_version: int | None = None,
        expires_at: datetime | None = None,
    ) -> SessionRecord:
        """Write a session record, compare-and-set on its version.

        ``expected_version`` None writes unconditionally; 0 requires the record to be absent
        (or expired); n requires version n. The written record has version (previous or 0) + 1.
        ``expires_at`` raises the session's lifetime to at least it, in the same write; the
        returned record's ``expires_at`` is the session's lifetime after the write.

        Raises:
            ConflictError: the stored version is not ``expected_version``.
        """
        ...

    async def delete_session(self, session_id: str) -> None:
        """Delete a session's turns and records and remove it from its user's list."""
        ...

    # -- long-term memory ------------------------------------------------------------

    async def put_memory(
        self, record: MemoryRecord, *, expected_version: int | None = None
    ) -> MemoryRecord:
        """Store a memory record as given.

        With ``expected_version`` None the write is unconditional. Otherwise the stored
        record must have that version (0: must be absent) and ``record.version`` must be
        ``expected_version + 1``.

        Raises:
            ConflictError: the stored version is not ``expected_version``.
            ValidationError: ``record.version`` is not ``expected_version + 1``, or the
                record is over :data:`MAX_MEMORY_BYTES`.
        """
        ...

    async def get_memory(self, user_id: str, memory_id: str) -> MemoryRecord | None:
        """One memory record, or None if it is absent or expired."""
        ...

    async def get_memories(
        self, user_id: str, memory_ids: Collection[str]
    ) -> dict[str, MemoryRecord]:
        """Several of a user's memory records at once, keyed by id.

        The same records :meth:`get_memory` would return for each id, read in as few round
        trips as the backend allows (not one snapshot: a concurrent write may be seen for
        some ids and not others). Absent and expired ids are left out of the result;
        duplicate ids are allowed and read once; no ids give ``{}``.

        Raises:
            ValidationError: a bad ``user_id`` or id, ``memory_ids`` given as one string, or
                more than :data:`MAX_MEMORY_IDS_PER_GET` ids; nothing was read.
        """
        ...

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
        """A user's memories, newest ``created_at`` first, filtered by type and time.

        ``since`` is inclusive, ``until`` exclusive. Expired records are left out unless
        ``include_expired``. Superseded records are returned: hiding them is recall's job.
        """
        ...

    async def delete_memory(self, user_id: str, memory_id: str) -> bool:
        """Delete one memory; False if there was none."""
        ...

    async def purge_user(self, user_id: str) -> int:
        """Delete everything of a user: memories, and every registered session's turns and
        records. Returns how many sessions and memories were deleted."""
        ...

    async def aclose(self) -> None:
        """Release connections. The store is not used afterwards."""
        ...


@runtime_checkable
class CombinedAppend(Protocol):
    """A hot store that can write a turn to the durable tier and to itself in one round trip,
    when both live on the same server (Redis hot + Redis durable): one atomic script
    archives the turns (with their idempotency key and entity change) and then appends them
    to the hot session. The write-through path uses it when ``can_append_through`` says so.
    """

    def can_append_through(self, durable: DurableStore) -> bool:
        """Whether :meth:`append_through` works with this durable store."""
        ...

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
        """Archive ``turns`` as :meth:`DurableStore.append_turns` would (``first_index``,
        when given, must equal the archive's next index, else ConflictError and nothing
        is written), then append the stored turns to the hot session as
        :meth:`HotStore.append_turns` with ``first_index`` would -- atomically. The entity
        change goes to both tiers. Returns the stored turns and the hot result.

        The hot half is skipped, and the hot result is None, when the append was a
        recognised retry, when the stored turns have expired, or when the hot session's
        ``next_index`` differs from the archive's (the hot tier lost turns or the session).
        An absent hot session is created (result ``version == 1``). In every one of those
        cases the caller rebuilds the hot session from the durable tier (a rare path)."""
        ...


@runtime_checkable
class BuiltAppend(Protocol):
    """A :class:`CombinedAppend` with an entry for the tiered layer: the same write and the
    same checks as :meth:`CombinedAppend.append_through`, returning the hot version
    instead of building a :class:`HotAppendResult` the caller would not read (the memory
    store's turn path, issue #8). The tiered layer takes it only where the class that
    defines it also defines ``append_through`` (a subclass overriding ``append_through``,
    a test's fault injection, is not gone around)."""

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
        """:meth:`CombinedAppend.append_through`, every argument checked as there. Returns
        the stored turns and the hot session's new version (None where ``append_through``
        returns no hot result). ``now``: a reading of the store's own clock (its ``clock``
        attribute) that the caller took for this write, used instead of a second reading
        (None: the store reads its clock)."""
        ...


@runtime_checkable
class InProcessRead(Protocol):
    """A hot store living in this process (the memory store) that hands the tiered layer
    a live session's parts without building a :class:`SessionSnapshot` it would take
    apart at once (every ``history()`` reads one, issue #8). The tiered layer takes it
    only where the class that defines it also defines ``load`` (a subclass overriding
    ``load``, a test's fault injection, is not gone around)."""

    def read_now(
        self, session_id: str
    ) -> (
        tuple[
            SessionMetadata,
            tuple[Turn, ...],
            dict[str, ActiveEntity],
            dict[str, StateBlob],
            int,
            datetime,
            datetime,
        ]
        | None
    ):
        """:meth:`HotStore.load` of a live session that has metadata, as ``(metadata,
        turns, entities, state, next_index, expires_at, now)``, the two mappings fresh
        copies and ``now`` the reading of the store's clock (its ``clock`` attribute) the
        session was judged live at; None for anything else (absent, expired, no metadata:
        ask :meth:`HotStore.load`).

        Raises:
            ValidationError: a bad session id.
        """
        ...


@runtime_checkable
class InProcessAppend(Protocol):
    """A hot store living in this process (the memory store) that takes turns a durable
    store has just numbered and stored without checking them again: the hot half of
    every write-through turn of the embedded default (issue #8). The tiered layer takes it
    only where the class that defines it also defines ``append_turns`` (a subclass
    overriding ``append_turns``, a test's fault injection, is not gone around)."""

    def append_archived(
        self,
        session_id: str,
        turns: list[Turn],
        *,
        window: int,
        expires_at: datetime,
        entities: EntityChange | None = None,
    ) -> int:
        """:meth:`HotStore.append_turns` of ``turns`` as a durable store returned them
        (numbered, consecutive, each checked against :data:`MAX_TURN_BYTES`), pinned to
        the first one's index (``first_index``); returns the session's new version. The
        session id, the turns and ``entities`` are not checked again: the durable store
        checked them, and frozen models cannot have changed since.

        Raises:
            ConflictError: the hot session's next index is not the first turn's; nothing
                was written.
        """
        ...


@runtime_checkable
class CombinedRead(Protocol):
    """A hot store that can read a session and durable records of it in one round trip,
    when both live on the same server (Redis hot + Redis durable): the read path of
    ``Session.context``, which needs the hot window and the summary records on every call.
    Offered where :meth:`CombinedAppend.can_append_through` accepts the durable store."""

    async def load_with_records(
        self, durable: DurableStore, session_id: str, kinds: Sequence[str]
    ) -> tuple[SessionSnapshot | None, list[SessionRecord | None]]:
        """:meth:`HotStore.load` and :meth:`DurableStore.get_record` of each of ``kinds``,
        answered together."""
        ...
