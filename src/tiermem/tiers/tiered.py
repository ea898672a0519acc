"""The hot and durable tiers working as one session store.

:class:`TieredSessionStore` owns the rules that cross tiers (ARCHITECTURE.md, "Tiers"):

* **Write-through** (default): the durable tier allocates the turn index (it is the only
  tier that survives everything, so it is the one allocator that keeps indexes gap-free
  under concurrent writers and crashes), then the hot tier gets the same turn with that
  index. A turn is acknowledged only after both, or after the durable write alone when the
  hot tier is unreachable and the policy is ``bypass``.
* **Write-behind** (opt-in): the hot tier allocates; the durable tier is flushed every
  ``write_behind_every`` turns, at close, by the expiry sweeper, and by whatever first
  meets an expired hot session the hot tier still holds (a read, an append), before that
  session is replaced (docs/decisions.md, "Write-behind after an expiry").
* **Proximity wins**: reads come from the hot tier. A miss (expired, evicted, restarted)
  rebuilds the hot session from the durable tier (last ``window`` turns, metadata, active
  entities, state) and carries on: the caller sees no amnesia, only a ``reload`` in stats.
* **The hot tier is a cache that heals itself**: when concurrent writers reach it out of
  order, or it lost the session, it is rebuilt from the durable tier with one atomic,
  version-checked :meth:`~tiermem.store.contract.HotStore.restore`, so a rebuild racing
  another writer never drops a turn that writer already acknowledged.
* **The durable tier is the source of truth for versions**: metadata, entities and state
  are compare-and-set in the durable tier first, then copied to the hot tier (state blobs
  with their durable version, so a reload never restarts a compare-and-set sequence).
* **A session lives as long as anything of it does**: every durable write carries the
  retention, and the durable tier keeps the session's owner and records for as long as
  the latest of them (contract: "A durable session's lifetime").

Durable session records written here: ``metadata`` (SessionMetadata), ``entities``
(kind → ActiveEntity) and ``state`` (name → {version, data, updated_at}).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from tiermem.clock import Clock
from tiermem.errors import (
    BackendTimeoutError,
    BackendUnavailableError,
    ConflictError,
    NotFoundError,
    ValidationError,
)
from tiermem.models import (
    ActiveEntity,
    JsonValue,
    NewTurn,
    SessionMetadata,
    SessionRecord,
    SessionRef,
    SessionSnapshot,
    StateBlob,
    TextBlock,
    Turn,
)
from tiermem.models.base import fields_with
from tiermem.policies.ttl import TtlEvent, TtlPolicy, trusted_expiry
from tiermem.retry import CAS_ATTEMPTS, pause
from tiermem.store.contract import (
    MAX_TURNS_PER_APPEND,
    BuiltAppend,
    Capability,
    CombinedAppend,
    CombinedRead,
    DurableStore,
    EntityChange,
    HotStore,
    InProcessAppend,
    InProcessRead,
)
from tiermem.tiers.config import HotFailurePolicy, SessionTierConfig, WritePolicy

__all__ = [
    "SessionView",
    "TierMetrics",
    "TieredSessionStore",
    "derive_metadata",
    "rebase_entity_change",
]

logger = logging.getLogger(__name__)

META, ENTITIES, STATE = "metadata", "entities", "state"
LOST_TURN_TEXT = "[turn lost from the hot tier before its write-behind flush]"
"""Text of the placeholder archived in place of a write-behind turn the hot tier lost."""
_PURGE_PAGE = 500
T = TypeVar("T")

Source = Literal["hot", "reload", "durable"]


class _Bypassed:
    """The hot tier was unreachable and the operation was skipped (policy ``bypass``)."""


BYPASSED = _Bypassed()


@dataclass
class TierMetrics:
    """Counters since the store was created (process-local)."""

    hot_hits: int = 0
    reloads: int = 0
    """Hot misses served by rebuilding the hot session from the durable tier."""
    bypasses: int = 0
    """Operations served by the durable tier alone because the hot tier was unreachable."""
    hot_resyncs: int = 0
    """Hot sessions rebuilt because concurrent writers reached the hot tier out of order."""
    flushes: int = 0
    flushed_turns: int = 0
    lost_turns: int = 0
    """Write-behind turns found missing from the hot tier at flush time (archived as
    placeholders so that numbering stays gap-free and later turns still flush)."""


@dataclass(frozen=True)
class SessionView:
    """A session as the caller sees it, from whichever tier served it.

    A view read from the hot tier derives its ``metadata`` (``turn_count`` and
    ``last_activity`` come from the log, :func:`derive_metadata`) on first access: most
    reads (``history()``, the turn path) never look at those two fields, and deriving them
    is most of a hot read's own work. The result is the same whenever it is asked for: a
    view is frozen, so what it derives from cannot change.
    """

    metadata: SessionMetadata
    turns: tuple[Turn, ...]
    entities: dict[str, ActiveEntity]
    state: dict[str, StateBlob]
    next_index: int
    expires_at: datetime | None
    source: Source
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def stored_metadata(self) -> SessionMetadata:
        """The metadata as the tier stores it: every field but the derived ``turn_count``
        and ``last_activity`` (which may be stale here) is the view's. What the tiers need
        on the turn path (ids, creation time, user tier), without deriving the rest."""
        values = self.__dict__
        metadata: SessionMetadata | None = values.get("metadata")
        return metadata if metadata is not None else values[_PENDING][0]

    def after_append(self, next_index: int, entities: dict[str, ActiveEntity]) -> SessionView:
        """This view with a new ``next_index`` and ``entities``: what
        ``dataclasses.replace`` gives (the same ``metadata``, derived from this view's
        turns and count if it was not yet), without its field-by-field introspection
        (about 8x slower, and a session handle does this on every turn)."""
        values = self.__dict__
        metadata: SessionMetadata | None = values.get("metadata")
        return _view(
            metadata if metadata is not None else values[_PENDING],
            self.turns,
            entities,
            self.state,
            next_index,
            self.expires_at,
            self.source,
            self.extra,
        )


class _DerivedMetadata:
    """:attr:`SessionView.metadata` of a view built by :func:`_view` that has not derived
    it yet: a non-data descriptor, so a view whose ``__dict__`` holds ``metadata`` never
    reaches it. (A ``__getattr__`` on the class did this before: every attribute read of
    every view then went through Python's slower hook for classes that define one.)"""

    def __get__(self, view: SessionView | None, owner: type | None = None) -> Any:
        if view is None:
            return self
        pending = view.__dict__.get(_PENDING)
        if pending is None:
            raise AttributeError(f"{type(view).__name__!r} object has no attribute 'metadata'")
        metadata = derive_metadata(*pending)
        view.__dict__["metadata"] = metadata  # computed once (a frozen view's value)
        return metadata


if not TYPE_CHECKING:  # for the type checker ``metadata`` is a plain field
    SessionView.metadata = _DerivedMetadata()

_PENDING = "_pending_metadata"
"""Key, in a lazily derived :class:`SessionView`'s ``__dict__``, of the arguments of the
:func:`derive_metadata` call that gives its ``metadata``."""
_Pending = tuple[SessionMetadata, tuple[Turn, ...], int]


def _view(
    metadata: SessionMetadata | _Pending,
    turns: tuple[Turn, ...],
    entities: dict[str, ActiveEntity],
    state: dict[str, StateBlob],
    next_index: int,
    expires_at: datetime | None,
    source: Source,
    extra: dict[str, Any],
) -> SessionView:
    """``SessionView(...)`` in one step: a frozen dataclass's ``__init__`` sets each field
    with ``object.__setattr__``, twice as slow, and two views are built per turn.
    ``metadata`` given as ``(stored, turns, next_index)`` is derived from them when first
    read (:class:`_DerivedMetadata`)."""
    view = _new(SessionView)
    _set(
        view,
        "__dict__",
        {
            "metadata" if type(metadata) is not tuple else _PENDING: metadata,
            "turns": turns,
            "entities": entities,
            "state": state,
            "next_index": next_index,
            "expires_at": expires_at,
            "source": source,
            "extra": extra,
        },
    )
    return view


_new = object.__new__
_set = object.__setattr__


_TIMESTAMP = attrgetter("timestamp")
_DERIVED = frozenset({"turn_count", "last_activity"})


def derive_metadata(
    metadata: SessionMetadata, turns: Sequence[Turn], next_index: int
) -> SessionMetadata:
    """Metadata with turn_count and last_activity derived from the log, never stored per turn
    (a per-turn metadata write would race with callers' metadata updates)."""
    last = metadata.last_activity
    if turns:
        newest = max(map(_TIMESTAMP, turns))
        if newest > last:
            last = newest
    if metadata.turn_count == next_index and last is metadata.last_activity:
        return metadata
    # Both values come from validated models: a copy without pydantic's copy machinery
    # (this runs on every read of a session).
    return SessionMetadata.trusted(
        {**metadata.__dict__, "turn_count": next_index, "last_activity": last},
        fields_with(metadata.__pydantic_fields_set__, _DERIVED),
    )


def _defined_by(cls: type, name: str) -> type | None:
    """The class in ``cls``'s MRO whose body defines ``name`` (None: none does)."""
    return next((klass for klass in cls.__mro__ if name in vars(klass)), None)


class TieredSessionStore:
    """Sessions over a hot and a durable store. One per process; safe for concurrent tasks."""

    def __init__(
        self,
        hot: HotStore,
        durable: DurableStore,
        *,
        clock: Clock,
        ttl_policy: TtlPolicy,
        config: SessionTierConfig | None = None,
    ) -> None:
        self.hot = hot
        self.durable = durable
        self.clock = clock
        self.ttl_policy = ttl_policy
        # The policy by position, without its argument checks for the built-in policies:
        # every value passed here comes from a validated session or the clock (a read and a
        # write per turn).
        self._expiry = trusted_expiry(ttl_policy)
        self.config = config or SessionTierConfig()
        self.metrics = TierMetrics()
        # Decided once: a runtime Protocol check costs more than a plain turn's Python work.
        self._combined: CombinedAppend | None = None
        if isinstance(hot, CombinedAppend) and hot.can_append_through(durable):
            self._combined = hot
        # Its entry for this layer (no result object), where the class defining it also
        # defines append_through: a subclass's own append_through is not gone around.
        self._built: BuiltAppend | None = (
            hot
            if self._combined is not None
            and isinstance(hot, BuiltAppend)
            and _defined_by(type(hot), "append_built") is _defined_by(type(hot), "append_through")
            else None
        )
        # Capabilities are declared (class constants): looked up once, not on every append.
        self._durable_takes_entities = _takes_entities(durable)
        self._hot_takes_entities = _takes_entities(hot)
        self._optimistic = Capability.OPTIMISTIC_APPEND in durable.capabilities
        # A hot store written to the contract before keep_expired existed does not take
        # it: write-behind works over it as it did (an append after an expiry, before a
        # sweep, starts the session afresh), not with a TypeError on every turn.
        self._hot_keeps_expired = Capability.KEEP_EXPIRED in hot.capabilities
        if (
            self.config.write_policy is not WritePolicy.WRITE_THROUGH
            and not self._hot_keeps_expired
        ):
            logger.warning(
                "hot store %s does not declare keep_expired: under write-behind, a turn added "
                "after a session expired and before the expiry sweeper flushed it drops the "
                "turns not flushed yet; run the sweeper, or declare Capability.KEEP_EXPIRED",
                getattr(hot, "name", type(hot).__name__),
            )
        # The hot half of a write-through append without checking the archived turns
        # again, where the class defining it also defines append_turns (a subclass's own
        # append_turns is not gone around): every turn of the embedded default.
        self._append_archived: InProcessAppend | None = (
            hot
            if isinstance(hot, InProcessAppend)
            and _defined_by(type(hot), "append_archived") is _defined_by(type(hot), "append_turns")
            else None
        )
        # A hot read without a snapshot object, where the class defining it also defines
        # load (a subclass's own load is not gone around): every history() of memory+memory.
        self._read_now: InProcessRead | None = (
            hot
            if isinstance(hot, InProcessRead)
            and _defined_by(type(hot), "read_now") is _defined_by(type(hot), "load")
            else None
        )
        # The hot store judges expiry by this store's clock (the composition gives both
        # the same one): a reading taken here serves it too, and one it took serves here.
        self._same_clock = getattr(hot, "clock", None) is clock
        # Session.context's read (hot window + summary records) in one round trip.
        self._combined_read: CombinedRead | None = None
        if self._combined is not None and isinstance(hot, CombinedRead):
            self._combined_read = hot

    # -- expiry -------------------------------------------------------------------------

    def hot_expiry(
        self,
        metadata: SessionMetadata,
        turn_count: int,
        event: TtlEvent,
        current: datetime | None,
        now: datetime | None = None,
    ) -> datetime | None:
        """The hot expiry the TTL policy gives for ``event`` (``now``: the clock, unless
        the caller read it already for this write)."""
        return self._expiry(
            self.clock.now() if now is None else now,
            metadata.created_at,
            turn_count,
            metadata.user_tier,
            event,
            current,
        )

    def _write_expiry(
        self,
        metadata: SessionMetadata,
        turn_count: int,
        current: datetime | None = None,
        now: datetime | None = None,
    ) -> datetime:
        new = self.hot_expiry(metadata, turn_count, "write", current, now)
        if new is not None:
            return new
        if current is not None:
            return current
        # A policy that never moves the expiry still needs one for the first write.
        fallback = self.hot_expiry(metadata, turn_count, "write", None)
        return fallback or self.clock.now()

    def durable_expiry(self, now: datetime | None = None) -> datetime | None:
        """When what is written to the durable tier now expires (None: never); ``now``:
        the clock, unless the caller read it already for this write."""
        ttl = self.config.durable_ttl
        if ttl is None:
            return None
        return (self.clock.now() if now is None else now) + ttl

    # -- the hot tier behind its failure policy ----------------------------------------

    async def _hot(self, op: Callable[[], Awaitable[T]], what: str) -> T | _Bypassed:
        """Run a hot-tier operation under the failure policy; BYPASSED if it was skipped."""
        try:
            return await op()
        except (BackendUnavailableError, BackendTimeoutError) as exc:
            return self._bypass(exc, what)

    def _bypass(self, exc: BackendUnavailableError | BackendTimeoutError, what: str) -> _Bypassed:
        """The failure policy for a hot-tier operation that failed: raise, or skip it. (The
        busiest calls catch the errors themselves and come here, without :meth:`_hot`'s
        closure and extra coroutine.)"""
        if self.config.on_hot_failure is HotFailurePolicy.RAISE:
            raise exc
        self.metrics.bypasses += 1
        logger.warning("hot tier unreachable during %s, serving from durable: %s", what, exc)
        return BYPASSED

    # -- open / read ------------------------------------------------------------------------

    async def create(self, metadata: SessionMetadata) -> SessionView:
        """Open a session: the existing one if any tier knows it, else a new one.

        A new session id is claimed for its user in the durable tier first (atomically: of
        two users creating one id at once, one gets it), then its metadata is written to
        both tiers before any turn, so a later hot miss is always detectable.

        Raises:
            ValidationError: the id belongs to another user while anything of it lives.
        """
        sid, user = metadata.session_id, metadata.user_id
        existing = await self.view(sid)
        if existing is not None:
            _check_owner(sid, existing.metadata.user_id, user)
            return existing
        holder = await self.durable.register_session(
            SessionRef(session_id=sid, user_id=user, created_at=metadata.created_at),
            expires_at=self.durable_expiry(),
        )
        _check_owner(sid, holder.user_id, user)
        try:
            await self.durable.put_record(
                sid,
                META,
                metadata.model_dump(mode="json"),
                expected_version=0,
                expires_at=self.durable_expiry(),
            )
        except ConflictError:
            # Another device of this user opened the same session at the same moment.
            view = await self.view(sid)
            if view is not None:
                return view
            raise
        expires_at = self._write_expiry(metadata, 0)
        await self._hot(
            lambda: self.hot.put_metadata(sid, metadata, expires_at=expires_at), "create"
        )
        return SessionView(metadata, (), {}, {}, 0, expires_at, "hot")

    async def view(self, session_id: str, *, refresh_ttl: bool = True) -> SessionView | None:
        """The session from the hot tier, rebuilt from the durable tier on a miss.

        Returns None when neither tier knows the session. A read refreshes the hot expiry
        when the TTL policy says reads do.
        """
        local = self._read_now
        if local is not None:
            parts = local.read_now(session_id)
            if parts is not None:  # a hot hit; anything else takes load's path below
                self.metrics.hot_hits += 1
                metadata, turns, entities, state, next_index, expires_at, now = parts
                if refresh_ttl:
                    new = self._read_expiry(
                        metadata, next_index, expires_at, now if self._same_clock else None
                    )
                    if new is not None:
                        await self._touch(session_id, new)
                return _view(
                    (metadata, turns, next_index),  # derived when first read
                    turns,
                    entities,
                    state,
                    next_index,
                    expires_at,
                    "hot",
                    {},
                )
        snap: SessionSnapshot | _Bypassed | None
        try:  # what _hot does, inline: this read is on every history() and view()
            snap = await self.hot.load(session_id)
        except (BackendUnavailableError, BackendTimeoutError) as exc:
            snap = self._bypass(exc, "load")
        if isinstance(snap, SessionSnapshot) and snap.metadata is not None:
            self.metrics.hot_hits += 1
            view = self._from_snapshot(snap, "hot")
            if refresh_ttl:
                # _refresh_on_read, inline: most reads move the expiry too little to write.
                new = self._read_expiry(snap.metadata, snap.next_index, snap.expires_at)
                if new is not None:
                    await self._touch(session_id, new)
            return view
        if snap is None and self.config.write_policy is WritePolicy.WRITE_BEHIND:
            # An expired hot session is held a while before it is collected, with the turns
            # not flushed yet: archive them before the reload replaces it.
            await self.flush(session_id, include_expired=True)
        if isinstance(snap, SessionSnapshot) and snap.turns:
            # A half-built session (no metadata): a write-behind append re-created it after
            # a loss, and other writers may have appended on top. Its writer rebuilds it,
            # but replaced now its turns would be gone: archive them first.
            rebuilt = await self._adopted(session_id, snap.turns)
        else:
            rebuilt = await self.durable_view(session_id)
        if rebuilt is None or snap is BYPASSED:
            return rebuilt
        self.metrics.reloads += 1
        logger.info(
            "hot miss for session %s: reloaded %d turns from durable",
            session_id,
            len(rebuilt.turns),
        )
        # A snapshot without metadata is a half-built session (a write-behind append that
        # reached an empty hot tier): replace it, conditionally on what we saw.
        seen = snap.version if isinstance(snap, SessionSnapshot) else 0
        if not await self._restore(rebuilt, expected_version=seen):
            # Another writer rebuilt or wrote it first: theirs is at least as fresh.
            fresher = await self._hot(lambda: self.hot.load(session_id), "load")
            if isinstance(fresher, SessionSnapshot) and fresher.metadata is not None:
                return self._from_snapshot(fresher, "reload")
        return replace(rebuilt, source="reload")

    async def _adopted(self, session_id: str, turns: Sequence[Turn]) -> SessionView | None:
        """The durable view followed by the ``turns`` of a half-built hot session that the
        archive does not hold, renumbered to continue it and archived first (conditional
        on the archive's next index, as the session's writer does in
        :meth:`_rebuild_after_loss`, which then finds its own turns archived), so that a
        read replacing the session drops none of them. None if the archive does not
        know the session."""
        moved: list[Turn] = []
        for attempt in range(CAS_ATTEMPTS):
            view = await self.durable_view(session_id)
            if view is None:
                return None
            pending = await self._unarchived(view, turns, moved, lacking_is_archived=False)
            rebuilt = _continued(view, pending)
            if not pending or await self._archive_moved(
                session_id, rebuilt.turns[len(view.turns) :], view.next_index, moved
            ):
                return rebuilt
            await pause(attempt)  # the archive moved meanwhile: look again
        return await self.durable_view(session_id)

    def view_now(self, session_id: str) -> SessionView | None:
        """:meth:`view` answered without awaiting, when it can be: a hot hit on a store
        that reads in this process (:class:`~tiermem.store.contract.InProcessRead`) whose
        expiry the read leaves where it is. None: ask :meth:`view` (another hot store, a
        miss, or a read that moves the expiry, at most once per
        ``read_refresh_granularity``). ``history()`` tries it first: one coroutine less
        per read."""
        local = self._read_now
        if local is None:
            return None
        parts = local.read_now(session_id)
        if parts is None:
            return None
        metadata, turns, entities, state, next_index, expires_at, now = parts
        same = self._same_clock
        if self._read_expiry(metadata, next_index, expires_at, now if same else None) is not None:
            return None
        self.metrics.hot_hits += 1
        return _view(
            (metadata, turns, next_index), turns, entities, state, next_index, expires_at, "hot", {}
        )

    async def view_with_records(
        self, session_id: str, kinds: Sequence[str]
    ) -> tuple[SessionView | None, list[SessionRecord | None]]:
        """:meth:`view` and the session's durable records ``kinds``: one round trip when the
        hot store reads both (:class:`~tiermem.store.contract.CombinedRead`), else the
        reads go out concurrently. A hot miss takes :meth:`view`'s path; a bypassed hot
        tier, :meth:`durable_view`'s."""
        combined = self._combined_read
        if combined is not None:
            got = await self._hot(
                lambda: combined.load_with_records(self.durable, session_id, kinds), "load"
            )
            if not isinstance(got, _Bypassed):
                snap, records = got
                if snap is None or snap.metadata is None:
                    return await self.view(session_id), records
                self.metrics.hot_hits += 1
                hot = self._from_snapshot(snap, "hot")
                await self._refresh_on_read(hot, snap.metadata)
                return hot, records
        view = self.view(session_id) if combined is None else self.durable_view(session_id)
        reads = asyncio.gather(*(self.durable.get_record(session_id, k) for k in kinds))
        found, records = await asyncio.gather(view, reads)
        return found, records

    async def _refresh_on_read(self, view: SessionView, metadata: SessionMetadata) -> None:
        """Move the hot expiry as the TTL policy says a read does. ``metadata``: the view's
        as stored (its ids, creation time and tier: the view's own is derived lazily)."""
        new = self._read_expiry(metadata, view.next_index, view.expires_at)
        if new is not None:
            await self._touch(metadata.session_id, new)

    def _read_expiry(
        self,
        metadata: SessionMetadata,
        turn_count: int,
        current: datetime | None,
        now: datetime | None = None,
    ) -> datetime | None:
        """The hot expiry a read moves the session to (:meth:`hot_expiry`), or None when it
        needs no write. A read right after another read or write moves the expiry by
        seconds: that extra write is skipped; it changes nothing a user would notice.
        ``now``: this store's clock, unless the caller read it already for this read."""
        new = self._expiry(
            self.clock.now() if now is None else now,
            metadata.created_at,
            turn_count,
            metadata.user_tier,
            "read",
            current,
        )
        if new is not None and (
            current is None or abs(new - current) >= self.config.read_refresh_granularity
        ):
            return new
        return None

    async def _touch(self, session_id: str, expires_at: datetime) -> None:
        await self._hot(lambda: self.hot.touch(session_id, expires_at=expires_at), "touch")

    def _from_snapshot(self, snap: SessionSnapshot, source: Source) -> SessionView:
        assert snap.metadata is not None
        return _view(
            (snap.metadata, snap.turns, snap.next_index),  # derived when first read
            snap.turns,
            dict(snap.entities),
            dict(snap.state),
            snap.next_index,
            snap.expires_at,
            source,
            {},
        )

    async def durable_view(self, session_id: str) -> SessionView | None:
        """The session as the durable tier has it (last ``window`` turns), without touching
        the hot tier; None if the durable tier does not know it."""
        meta_rec, ent_rec, state_rec, turns, next_index = await asyncio.gather(
            self.durable.get_record(session_id, META),
            self.durable.get_record(session_id, ENTITIES),
            self.durable.get_record(session_id, STATE),
            self.durable.tail_turns(session_id, self.config.window),
            self.durable.next_index(session_id),
        )
        if meta_rec is None:
            return None
        if turns:
            # Two reads, not one snapshot: a turn appended between them is in ``turns`` but
            # not in the counter read before it (the counter is never below a stored turn).
            next_index = max(next_index, turns[-1].index + 1)
        metadata = SessionMetadata.model_validate(meta_rec.data)
        entities = _entities(ent_rec.data) if ent_rec else {}
        state = _state(state_rec.data) if state_rec else {}
        return SessionView(
            metadata=derive_metadata(metadata, turns, next_index),
            turns=tuple(turns),
            entities=entities,
            state=state,
            next_index=next_index,
            expires_at=None,
            source="durable",
        )

    async def _restore(self, view: SessionView, *, expected_version: int | None) -> bool:
        """Rebuild the hot session from a durable view in one atomic write. False if the
        hot session was not at ``expected_version`` (nothing written) or the hot tier is
        unreachable."""
        expires_at = self._write_expiry(view.metadata, view.next_index)
        try:
            done = await self._hot(
                lambda: self.hot.restore(
                    view.metadata.session_id,
                    turns=view.turns,
                    next_index=view.next_index,
                    metadata=view.metadata,
                    entities=view.entities,
                    state=view.state,
                    window=self.config.window,
                    expires_at=expires_at,
                    expected_version=expected_version,
                ),
                "reload",
            )
        except ConflictError:
            return False
        return not isinstance(done, _Bypassed)

    # -- append ------------------------------------------------------------------------------

    async def append(
        self,
        metadata: SessionMetadata,
        turns: Sequence[NewTurn],
        *,
        turn_count_hint: int,
        idempotency_key: str | None = None,
        entities: EntityChange | None = None,
        now: datetime | None = None,
    ) -> list[Turn]:
        """Add turns; returns them with their indexes once the write policy is satisfied.

        With ``idempotency_key`` a retry returns the turns the first attempt stored instead
        of adding them again. Keyed appends are written through even under write-behind:
        the durable tier is where the key and the turns are recorded together.

        ``entities`` is the change these turns make to the active entities, its
        ``turn_index`` values counted from ``turn_count_hint`` (the index the caller
        expects the first turn to get). Written through, it rides in the same write as
        the turns (the first index pinned to the hint; on a conflict the change is moved
        to the indexes actually free and written again), or, on stores that cannot take
        it (no :attr:`Capability.ENTITIES_IN_APPEND`), merged by a compare-and-set after
        the append. A recognised retry applies no change.

        ``now``: a reading of :attr:`clock` the caller took for this write (an aware
        time), used for its expiries instead of another one; a retry after a conflict
        reads the clock again.
        """
        if entities is not None and not entities.upsert and not entities.remove:
            entities = None
        if self.config.write_policy is not WritePolicy.WRITE_THROUGH and not idempotency_key:
            behind = await self._append_write_behind(metadata, turns, turn_count_hint)
            if entities is not None and behind:
                await self._merge_entities_after(metadata, entities, turn_count_hint, behind)
            return behind
        # Write-through, in this coroutine: the combined stores' write is awaited from here,
        # not through two more coroutines (this is every turn's path).
        sid = metadata.session_id
        keyed_behind = False
        if idempotency_key and self.config.write_policy is WritePolicy.WRITE_BEHIND:
            # The durable tier numbers a keyed append: archive the turns the hot tier holds
            # unflushed (an expired copy's too) first, or they would be numbered over.
            keyed_behind = True
            await self.flush(sid, include_expired=True)
        key = idempotency_key
        in_append = entities is not None and self._durable_takes_entities
        # Pin the first index when the change names turn indexes (they must be the ones
        # allocated), or when the store saves a read by being told it.
        pin = in_append or self._optimistic
        first = turn_count_hint if pin else None
        base = turn_count_hint  # the index the change's turn indexes count from
        combined = self._combined
        stored: list[Turn] = []
        version: int | None = None
        for attempt in range(CAS_ATTEMPTS + 1):
            if attempt == CAS_ATTEMPTS:
                # The session kept moving under pinned writes: append unpinned, entities apart.
                first, in_append = None, False
            change = entities if in_append else None
            try:
                if combined is not None:
                    # Both tiers in one round trip (the hot store writes the durable one
                    # too). The expected count after the append sets the hot expiry (the
                    # TTL policy lengthens it with the session's depth).
                    count = (first if first is not None else turn_count_hint) + len(turns)
                    if now is None or attempt:
                        now = self.clock.now()  # one reading for both expiries
                    # _write_expiry's first step, inline: its fallbacks only when the
                    # policy keeps the (absent) current expiry.
                    hot_expires_at = self._expiry(
                        now, metadata.created_at, count, metadata.user_tier, "write", None
                    ) or self._write_expiry(metadata, count, None, now)
                    ttl = self.config.durable_ttl  # durable_expiry(now), inline
                    durable_expires_at = None if ttl is None else now + ttl
                    if self._built is not None:
                        stored, version = await self._built.append_built(
                            self.durable,
                            sid,
                            turns,
                            window=self.config.window,
                            hot_expires_at=hot_expires_at,
                            durable_expires_at=durable_expires_at,
                            idempotency_key=key,
                            entities=change,
                            first_index=first,
                            now=now if self._same_clock else None,
                        )
                    else:
                        stored, result = await combined.append_through(
                            self.durable,
                            sid,
                            turns,
                            window=self.config.window,
                            hot_expires_at=hot_expires_at,
                            durable_expires_at=durable_expires_at,
                            idempotency_key=key,
                            entities=change,
                            first_index=first,
                        )
                        version = None if result is None else result.version
                else:
                    stored = await self._append_durable(sid, turns, key, change, first)
                break
            except ConflictError as exc:
                if first is None:
                    raise
                actual = exc.actual
                if not isinstance(actual, int):
                    actual = await self.durable.next_index(sid)
                if entities is not None:
                    entities = rebase_entity_change(entities, base, actual, len(turns))
                    base = actual
                first = actual
        if not stored:
            return stored  # a retry whose turns have expired since: nothing to show
        if combined is None:
            if keyed_behind:
                await self._append_hot(metadata, stored, entities if in_append else None, True)
            else:
                await self._append_hot(metadata, stored, entities if in_append else None)
        elif version is None or version == 1:
            if keyed_behind:
                # The hot half was skipped or re-created the session: a plain writer may
                # hold the index the archive gave these turns (its turn must be kept).
                await self._rejoin_behind(sid, stored)
            else:
                # A retry, or the hot tier had lost turns or the session: rebuild it.
                await self._resync(sid)
        if entities is not None and not in_append:
            await self._merge_entities_after(metadata, entities, base, stored)
        return stored

    async def _merge_entities_after(
        self,
        metadata: SessionMetadata,
        change: EntityChange,
        expected_first: int,
        stored: Sequence[Turn],
    ) -> None:
        """The separate entity write, for stores that cannot take it in the append."""
        change = rebase_entity_change(change, expected_first, stored[0].index, len(stored))
        await self.update_entities(
            metadata, change.upsert, change.remove, turn_count_hint=stored[-1].index + 1
        )

    async def _append_durable(
        self,
        sid: str,
        turns: Sequence[NewTurn],
        key: str | None,
        change: EntityChange | None,
        first: int | None,
    ) -> list[Turn]:
        if change is None:  # stores without ENTITIES_IN_APPEND take no ``entities``
            return await self.durable.append_turns(
                sid, turns, first_index=first, expires_at=self.durable_expiry(), idempotency_key=key
            )
        return await self.durable.append_turns(
            sid,
            turns,
            first_index=first,
            expires_at=self.durable_expiry(),
            idempotency_key=key,
            entities=change,
        )

    async def _append_hot(
        self,
        metadata: SessionMetadata,
        stored: list[Turn],
        change: EntityChange | None,
        keyed_behind: bool = False,
    ) -> None:
        """Give the hot tier the turns the durable tier numbered (and their entity change,
        already in the durable tier): hot appends are pinned to those indexes, so the
        hot tier applies changes in the archive's order.

        ``keyed_behind``: a keyed append under write-behind, where the hot tier numbers
        the other writers' turns: whatever it holds is not rebuilt over, but rejoined
        (:meth:`_rejoin_behind`)."""
        sid = metadata.session_id
        turn_count = stored[-1].index + 1
        expires_at = self._write_expiry(metadata, turn_count)
        with_change = change is not None and self._hot_takes_entities
        archived = self._append_archived
        for attempt in range(self.config.hot_conflict_retries + 1):
            version: int
            try:  # what _hot does, inline: this write is on every turn
                if archived is not None:
                    # An in-process store: the version alone, the turns not checked again.
                    version = archived.append_archived(
                        sid,
                        stored,
                        window=self.config.window,
                        expires_at=expires_at,
                        entities=change if with_change else None,
                    )
                elif with_change:
                    version = (
                        await self.hot.append_turns(
                            sid,
                            stored,
                            window=self.config.window,
                            expires_at=expires_at,
                            first_index=stored[0].index,
                            entities=change,
                        )
                    ).version
                else:
                    version = (
                        await self.hot.append_turns(
                            sid,
                            stored,
                            window=self.config.window,
                            expires_at=expires_at,
                            first_index=stored[0].index,
                        )
                    ).version
            except (BackendUnavailableError, BackendTimeoutError) as exc:
                self._bypass(exc, "append")  # raises unless the policy is to bypass
                return
            except ConflictError as exc:
                if keyed_behind and isinstance(exc.actual, int) and exc.actual > stored[0].index:
                    # The hot tier holds a turn at our first index: ours (a retry), or a
                    # plain writer's that took it between our flush and our durable write.
                    await self._rejoin_behind(sid, stored)
                    return
                if isinstance(exc.actual, int) and exc.actual > stored[-1].index:
                    return  # a retried append whose turns the hot tier already has
                # Another writer's earlier index has not reached the hot tier yet.
                await pause(attempt)
                continue
            if version == 1:
                # The hot tier had lost the session (this write created it): rebuild it.
                if keyed_behind:
                    await self._rejoin_behind(sid, stored)
                else:
                    await self._resync(sid)
            elif change is not None and not with_change:
                # A hot store that takes no entities in the append: its merge right after.
                await self._hot(
                    lambda: self.hot.update_entities(
                        sid, change.upsert, change.remove, expires_at=expires_at
                    ),
                    "entities",
                )
            return
        if keyed_behind:
            await self._rejoin_behind(sid, stored)
        else:
            await self._resync(sid)

    async def _resync(self, session_id: str) -> SessionView | None:
        """Make the hot session equal to the durable one, version-checked so that a writer
        who reached the hot tier meanwhile is never overwritten with an older view.

        A half-built session (no metadata: a write-behind append re-created it after a
        loss, and other writers may have appended on top) is replaced only with its
        turns archived first, as a read does (:meth:`_adopted`). Returns the view the
        hot session was rebuilt to (None if it was not)."""
        self.metrics.hot_resyncs += 1
        for attempt in range(CAS_ATTEMPTS):
            # Not include_expired: restore counts an expired session as absent (version 0),
            # so checking against an expired session's own version could never succeed.
            snap = await self._hot(lambda: self.hot.load(session_id), "resync")
            if isinstance(snap, _Bypassed):
                return None
            if snap is not None and snap.metadata is None and snap.turns:
                view = await self._adopted(session_id, snap.turns)
            else:
                view = await self.durable_view(session_id)
            if view is None:
                return None
            seen = snap.version if snap is not None else 0
            if await self._restore(view, expected_version=seen):
                return view
            await pause(attempt)
        logger.warning("hot copy of session %s kept changing during resync", session_id)
        return None

    async def _rejoin_behind(self, session_id: str, stored: Sequence[Turn]) -> None:
        """Write-behind: the durable tier numbered a keyed append (``stored``), and the hot
        tier did not take it as it stood. Between this writer's flush and its durable
        write a plain writer may have appended to the hot tier, taking an index the
        durable tier then gave to ``stored``: the archive holds another turn there, so no
        flush would ever archive the plain one. Archive every hot turn from
        ``stored[0].index`` on that the archive does not hold at its index, in their
        order after the archive's last turn (an append conditional on the archive's next
        index, as a flush's), then rebuild the hot session as the durable view
        (compare-and-set on the hot version, as after a loss).

        Archiving them here rather than leaving them to the next flush keeps a flush
        that read the hot session before the rebuild from archiving them under their
        old numbers (it would find its index taken). A hot session that holds ``stored``
        at their indexes (a retry; a concurrent call with the same key) is left as it is
        after one hot read. The writer whose turn moved got the index before
        renumbering from its own append. A turn counts as archived when the archive's
        turn at its index is equal to it, or it is one this call archived."""
        first, last = stored[0].index, stored[-1].index
        moved: list[Turn] = []  # the hot turns this call archived, as archived
        for attempt in range(CAS_ATTEMPTS):
            # Not include_expired: restore counts an expired session as absent (version 0).
            snap = await self._hot(lambda: self.hot.load(session_id), "resync")
            if isinstance(snap, _Bypassed):
                return
            if snap is not None and snap.metadata is not None and snap.next_index > last:
                held = {t.index: t for t in snap.turns if first <= t.index <= last}
                if all(held.get(t.index, t) == t for t in stored):
                    return  # ours are there (or older than the hot window): nothing moved
            view = await self.durable_view(session_id)
            if view is None:
                return  # the archive forgot the session: nothing to rejoin
            # A half-built session (no metadata: a write-behind append re-created it after
            # a loss, numbered from 0) is replaced only with every turn of it archived, as
            # a read does (_adopted); else the turns from ours on, and an index the
            # archive lacks below its end has expired there: archived.
            recreated = snap is not None and snap.metadata is None
            later = []
            if snap is not None:
                later = [t for t in snap.turns if recreated or t.index >= first]
            pending = await self._unarchived(view, later, moved, lacking_is_archived=not recreated)
            rebuilt = _continued(view, pending)
            if pending and not await self._archive_moved(
                session_id, rebuilt.turns[len(view.turns) :], view.next_index, moved
            ):
                await pause(attempt)  # the archive moved meanwhile: look again
                continue
            if await self._restore(
                rebuilt, expected_version=snap.version if snap is not None else 0
            ):
                self.metrics.hot_resyncs += 1
                if moved:
                    logger.info(
                        "session %s: archived %d write-behind turns after a keyed turn that "
                        "took the index of the first (renumbered)",
                        session_id,
                        len(moved),
                    )
                return
            await pause(attempt)
        logger.warning("hot copy of session %s kept changing during rejoin", session_id)

    async def _unarchived(
        self,
        view: SessionView,
        turns: Sequence[Turn],
        moved: Sequence[Turn],
        *,
        lacking_is_archived: bool,
    ) -> list[Turn]:
        """Of hot ``turns`` (in index order), those the archive does not hold: past the
        archive's end (``view``), or the archive holds another turn at its index, and not
        one of ``moved`` (archived under another index by this caller). An index below
        the archive's end that it lacks counts as archived when ``lacking_is_archived``
        (the hot numbering is the archive's: the turn expired there). Otherwise the hot
        turns are a re-created session's, numbered from 0, which its writer and any
        reader archive renumbered: one equal but for its index to a turn of the durable
        view counts as archived too (two turns are equal only with the same time,
        role and content)."""
        sid = view.metadata.session_id
        archived = {t.index: t for t in view.turns}
        if turns and turns[0].index < view.next_index and turns[0].index not in archived:
            # The durable view's window starts after these hot turns: read the rest.
            end = min(view.next_index, turns[-1].index + 1)
            for turn in await self.durable.get_turns(sid, turns[0].index, end):
                archived.setdefault(turn.index, turn)
        by_time: dict[datetime, list[Turn]] = {}
        if not lacking_is_archived:
            for turn in view.turns:
                by_time.setdefault(turn.timestamp, []).append(turn)

        def held_there(turn: Turn) -> bool:
            held = archived.get(turn.index)
            if held is None:
                if lacking_is_archived and turn.index < view.next_index:
                    return True
            elif _archived_as(turn, held):
                return True
            same_time = by_time.get(turn.timestamp, ())
            return any(a == turn.model_copy(update={"index": a.index}) for a in same_time)

        return [
            t
            for t in turns
            if not held_there(t)
            and not any(t == m.model_copy(update={"index": t.index}) for m in moved)
        ]

    async def _archive_moved(
        self, session_id: str, turns: Sequence[Turn], first_index: int, moved: list[Turn]
    ) -> bool:
        """Append ``turns`` (numbered from ``first_index``) to the archive, each batch
        conditional on the archive's next index; those stored are added to ``moved``.
        False if another writer moved the archive first (the rest not written)."""
        for start in range(0, len(turns), MAX_TURNS_PER_APPEND):
            batch = turns[start : start + MAX_TURNS_PER_APPEND]
            try:
                await self.durable.append_turns(
                    session_id,
                    batch,
                    first_index=first_index + start,
                    expires_at=self.durable_expiry(),
                )
            except ConflictError:
                return False
            moved.extend(batch)
            self.metrics.flushes += 1
            self.metrics.flushed_turns += len(batch)
        return True

    async def _append_write_behind(
        self,
        metadata: SessionMetadata,
        turns: Sequence[NewTurn],
        turn_count_hint: int,
        *,
        keep_expired: bool = True,
    ) -> list[Turn]:
        sid = metadata.session_id
        now = self.clock.now()
        expires_at = self._write_expiry(metadata, turn_count_hint + len(turns), None, now)
        if expires_at <= now:
            return await self._append_past_expiry(sid, turns, now)
        try:
            # keep_expired: an expired session the hot tier still holds may hold turns not
            # flushed yet, which starting it afresh would drop without a trace.
            if keep_expired and self._hot_keeps_expired:
                result = await self._hot(
                    lambda: self.hot.append_turns(
                        sid,
                        turns,
                        window=self.config.window,
                        expires_at=expires_at,
                        keep_expired=True,
                    ),
                    "append",
                )
            else:
                result = await self._hot(
                    lambda: self.hot.append_turns(
                        sid, turns, window=self.config.window, expires_at=expires_at
                    ),
                    "append",
                )
        except ConflictError:
            # Nothing else is asked of this append: the session expired and is held.
            return await self._append_after_expiry(metadata, turns, turn_count_hint)
        if isinstance(result, _Bypassed):
            # Hot tier down: the durable tier is all we have, so write through.
            return await self.durable.append_turns(sid, turns, expires_at=self.durable_expiry())
        if result.version == 1:
            # The hot session was absent: this append re-created it, without its metadata
            # and numbered from where the hot tier restarted, not where the archive stands.
            durable_next = await self.durable.next_index(sid)
            return await self._rebuild_after_loss(metadata, turns, result.turns, durable_next)
        every = self.config.write_behind_every
        if result.next_index // every != result.turns[0].index // every:
            await self.flush(sid)
        return list(result.turns)

    async def _append_after_expiry(
        self, metadata: SessionMetadata, turns: Sequence[NewTurn], turn_count_hint: int
    ) -> list[Turn]:
        """A write-behind append found the hot session expired but still held (no sweeper
        has handed it off yet): archive the turns only it holds, reload the session from
        the archive (as a read after expiry does), then append, so the turns continue the
        archive's numbering with none dropped. Only here does the write-behind path pay
        for an expiry: the hot append refused (nothing written), one flush (a load with
        ``include_expired``, the archive's next index, an archive append when turns were
        pending) and one reload (the durable view's reads, a restore) come before it."""
        sid = metadata.session_id
        await self.flush(sid, include_expired=True)
        view = await self.durable_view(sid)
        if view is not None and await self._restore(view, expected_version=0):
            self.metrics.reloads += 1
        # Reloaded, or another writer reloaded or wrote it first (append to theirs), or the
        # archive forgot the session (started afresh, then rebuilt as after a loss).
        return await self._append_write_behind(metadata, turns, turn_count_hint, keep_expired=False)

    async def _append_past_expiry(
        self, session_id: str, turns: Sequence[NewTurn], now: datetime
    ) -> list[Turn]:
        """A write-behind append for which the TTL policy gives an expiry already past
        (:class:`~tiermem.policies.ttl.FixedTtl` after its deadline): a hot session written
        now would be expired on arrival and its turns lost with it, so the turns are written
        through, after the turns the expired hot copy still holds (unflushed ones keep
        their place ahead of these)."""
        await self.flush(session_id, include_expired=True)
        return await self.durable.append_turns(
            session_id, turns, expires_at=self.durable_expiry(now)
        )

    async def _rebuild_after_loss(
        self,
        metadata: SessionMetadata,
        turns: Sequence[NewTurn],
        ours: Sequence[Turn],
        durable_next: int,
    ) -> list[Turn]:
        """Our write-behind append re-created a hot session the hot tier had lost: without
        metadata (a half-built session, which the next read would replace with the durable
        view, dropping our turns) and numbered from where the hot tier restarted rather
        than where the archive stands. Writers may have appended on top of it in the
        meantime; archive every turn written since the re-creation (ours first) that the
        archive does not hold at its index, renumbered to continue the archive, then
        rebuild the hot session as the durable view, so none of them is dropped. Archived
        here, not left to the next flush: a flush racing the rebuild reads the re-created
        numbering, which the archive shares only past its end (a turn archived there
        stays, the rest of them follow it).

        Turns another writer added in that window keep their content and order, but the
        indexes their own append returned are the ones before renumbering."""
        sid = metadata.session_id
        first = ours[0].index
        moved: list[Turn] = []  # the hot turns this call archived, as archived
        for attempt in range(CAS_ATTEMPTS):
            # Not include_expired: restore counts an expired session as absent (version 0),
            # so checking against an expired session's own version could never succeed.
            snap = await self._hot(lambda: self.hot.load(sid), "resync")
            if isinstance(snap, _Bypassed):
                return await self.durable.append_turns(sid, turns, expires_at=self.durable_expiry())
            chain = [t for t in snap.turns if t.index >= first] if snap is not None else []
            view = await self.durable_view(sid)
            if view is None:
                return list(ours)  # the durable tier does not know the session: nothing to add
            if snap is None or chain[: len(ours)] != list(ours):
                # Another writer rebuilt the session meanwhile (or it is gone or expired):
                # ours is not in it under the old numbering. Archived already (by an
                # earlier attempt of this call, whose hot rebuild lost the race): they
                # are where the archive has them; else write them again.
                placed = _found(ours, (*moved, *view.turns))
                if placed is not None:
                    return placed
                # The resync archives the turns of a half-built session it replaces:
                # ours are not written again if it archived them.
                resynced = await self._resync(sid)
                placed = _found(ours, resynced.turns) if resynced is not None else None
                if placed is not None:
                    return placed
                return await self._append_write_behind(metadata, turns, durable_next)
            # A flush may have archived some of these turns under the re-created numbers
            # meanwhile (they stay where they are), and one that read the hot session
            # before the rebuild may still: archive the rest here, after the archive's
            # last turn (conditional on its next index), before the hot session is
            # rebuilt, so that such a flush finds its index taken instead of archiving a
            # turn a second time, or over the index the rebuild gave another.
            pending = await self._unarchived(view, chain, moved, lacking_is_archived=False)
            rebuilt = _continued(view, pending)
            if pending and not await self._archive_moved(
                sid, rebuilt.turns[len(view.turns) :], view.next_index, moved
            ):
                await pause(attempt)  # the archive moved meanwhile: look again
                continue
            if await self._restore(rebuilt, expected_version=snap.version):
                self.metrics.hot_resyncs += 1
                return [_placed(t, moved) for t in ours]
            await pause(attempt)
        logger.warning("hot copy of session %s kept changing during renumbering", sid)
        resynced = await self._resync(sid)  # archives what the half-built session still holds
        placed = _found(ours, (*moved, *(resynced.turns if resynced is not None else ())))
        if placed is not None:
            return placed  # archived by this call: not written a second time
        return await self._append_write_behind(metadata, turns, durable_next)

    async def flush(self, session_id: str, *, include_expired: bool = False) -> int:
        """Write-behind: copy turns the durable tier lacks from the hot tier. Returns how many.

        Idempotent; safe to run concurrently (the durable append is conditional on the
        archive's next index).
        """
        snap = await self._hot(
            lambda: self.hot.load(session_id, include_expired=include_expired), "flush"
        )
        if not isinstance(snap, SessionSnapshot):
            return 0
        durable_next = await self.durable.next_index(session_id)
        pending = [t for t in snap.turns if t.index >= durable_next]
        if not pending:
            return 0
        if pending[0].index != durable_next:
            # The hot tier lost turns before they were flushed (the documented loss window).
            # Archive a placeholder in each lost slot so numbering stays gap-free and every
            # later turn still flushes; the loss stays visible in the archive.
            lost = pending[0].index - durable_next
            pending = [*self._placeholders(durable_next, lost), *pending]
        else:
            lost = 0
        written = 0
        for start in range(0, len(pending), MAX_TURNS_PER_APPEND):
            batch = pending[start : start + MAX_TURNS_PER_APPEND]
            try:
                stored = await self.durable.append_turns(
                    session_id,
                    batch,
                    first_index=durable_next + start,
                    expires_at=self.durable_expiry(),
                )
            except ConflictError:
                break  # another flusher got there first
            if start == 0 and lost:
                # Counted once the placeholders are stored, so racing flushers count once.
                self.metrics.lost_turns += lost
                logger.error(
                    "write-behind lost %d turns of session %s before flush", lost, session_id
                )
            written += len(stored)
        if written:
            self.metrics.flushes += 1
            self.metrics.flushed_turns += written
        return written

    def _placeholders(self, first: int, count: int) -> list[Turn]:
        now = self.clock.now()
        return [
            Turn(
                index=first + i,
                role="assistant",
                content=(TextBlock(text=LOST_TURN_TEXT),),
                timestamp=now,
                metadata={"lost_before_flush": True},
            )
            for i in range(count)
        ]

    # -- metadata, entities, state ------------------------------------------------------

    async def _cas_record(
        self,
        session_id: str,
        kind: str,
        change: Callable[[dict[str, JsonValue] | None], dict[str, JsonValue]],
    ) -> tuple[dict[str, JsonValue], int]:
        """Read-modify-write a durable record with compare-and-set, retrying on conflict."""
        for attempt in range(CAS_ATTEMPTS):
            current = await self.durable.get_record(session_id, kind)
            new = change(current.data if current else None)
            try:
                record = await self.durable.put_record(
                    session_id,
                    kind,
                    new,
                    expected_version=current.version if current else 0,
                    expires_at=self.durable_expiry(),
                )
            except ConflictError:
                await pause(attempt)
                continue
            return record.data, record.version
        raise ConflictError(
            f"record {kind!r} of session {session_id!r} kept changing under "
            f"{CAS_ATTEMPTS} attempts; try again",
        )

    async def _mirror(
        self,
        session_id: str,
        kind: str,
        version: int,
        copy: Callable[[SessionSnapshot, dict[str, JsonValue]], Awaitable[object]],
        data: dict[str, JsonValue],
    ) -> None:
        """Copy a durable record's new value to the hot tier. Two updaters can reach the hot
        tier out of order, so after copying, the writer checks the durable version and
        copies again if it was overtaken: the last to finish leaves the newest value."""
        for _ in range(CAS_ATTEMPTS):
            snap = await self._hot(lambda: self.hot.load(session_id), kind)
            if not isinstance(snap, SessionSnapshot) or snap.metadata is None:
                return  # absent or unreachable: the next read reloads from durable
            await self._hot(partial(copy, snap, data), kind)
            latest = await self.durable.get_record(session_id, kind)
            if latest is None or latest.version == version:
                return
            data, version = latest.data, latest.version

    async def update_metadata(
        self, session_id: str, change: Callable[[SessionMetadata], SessionMetadata]
    ) -> SessionMetadata:
        """Apply ``change`` to the metadata, compare-and-set with retry; both tiers updated."""

        def apply(data: dict[str, JsonValue] | None) -> dict[str, JsonValue]:
            if data is None:
                raise NotFoundError(f"session {session_id!r} does not exist; open it first")
            return change(SessionMetadata.model_validate(data)).model_dump(mode="json")

        data, version = await self._cas_record(session_id, META, apply)

        async def copy(snap: SessionSnapshot, value: dict[str, JsonValue]) -> None:
            metadata = SessionMetadata.model_validate(value)
            await self.hot.put_metadata(session_id, metadata, expires_at=snap.expires_at)

        await self._mirror(session_id, META, version, copy, data)
        return SessionMetadata.model_validate(data)

    async def update_entities(
        self,
        metadata: SessionMetadata,
        upsert: Mapping[str, ActiveEntity],
        remove: Collection[str] = (),
        *,
        turn_count_hint: int = 0,
    ) -> dict[str, ActiveEntity]:
        """Merge active entities (a new value of a kind replaces the old): compare-and-set
        in the durable tier, then mirrored to the hot tier. Returns the merged entities."""
        sid = metadata.session_id
        if not upsert and not remove:
            view = await self.view(sid, refresh_ttl=False)
            return dict(view.entities) if view else {}

        def merge(data: dict[str, JsonValue] | None) -> dict[str, JsonValue]:
            merged = dict(data or {})
            for kind in remove:
                merged.pop(kind, None)
            merged.update({k: v.model_dump(mode="json") for k, v in upsert.items()})
            return merged

        data, version = await self._cas_record(sid, ENTITIES, merge)
        expires_at = self._write_expiry(metadata, turn_count_hint)
        # Our own change, as a merge: one hot write, no read (absent session: no-op).
        await self._hot(
            lambda: self.hot.update_entities(sid, upsert, remove, expires_at=expires_at),
            "entities",
        )
        latest = await self.durable.get_record(sid, ENTITIES)
        if latest is None or latest.version == version:
            return _entities(data)

        async def copy(snap: SessionSnapshot, value: dict[str, JsonValue]) -> None:
            # Overtaken by another writer: make the hot copy equal to the durable one.
            entities = _entities(value)
            gone = [k for k in snap.entities if k not in entities]
            await self.hot.update_entities(sid, entities, gone, expires_at=snap.expires_at)

        await self._mirror(sid, ENTITIES, latest.version, copy, latest.data)
        return _entities(latest.data)

    async def put_state(
        self,
        metadata: SessionMetadata,
        name: str,
        data: Mapping[str, JsonValue],
        *,
        expected_version: int | None,
        turn_count_hint: int = 0,
    ) -> StateBlob:
        """Write a state blob: compare-and-set on its version in the durable tier (the
        source of truth for versions), then copied to the hot tier with that version."""
        sid = metadata.session_id
        now = self.clock.now()

        def merge(current: dict[str, JsonValue] | None) -> dict[str, JsonValue]:
            blobs = dict(current or {})
            held = blobs.get(name)
            held_version = held["version"] if isinstance(held, dict) else 0
            assert isinstance(held_version, int)
            if expected_version is not None and held_version != expected_version:
                raise ConflictError(
                    f"state {name!r} of session {sid!r} is at version {held_version}, "
                    f"not {expected_version}; re-read it and retry",
                    expected=expected_version,
                    actual=held_version,
                )
            blobs[name] = {
                "version": held_version + 1,
                "data": dict(data),
                "updated_at": now.isoformat(),
            }
            return blobs

        expires_at = self._write_expiry(metadata, turn_count_hint)
        try:
            stored, _ = await self._cas_record(sid, STATE, merge)
        except ConflictError:
            # The caller's version came from somewhere: if it was a hot copy left behind
            # (a writer died between its durable write and its copy), repair the copy so
            # that the caller's re-read sees the durable version instead of conflicting
            # again until the hot session expires.
            current = await self.durable.get_record(sid, STATE)
            held = _state(current.data).get(name) if current else None
            if held is not None:
                await self._hot(
                    lambda: self.hot.copy_state(sid, held, expires_at=expires_at), "state"
                )
            raise
        blob = _state(stored)[name]
        await self._hot(lambda: self.hot.copy_state(sid, blob, expires_at=expires_at), "state")
        return blob

    # -- lifecycle ------------------------------------------------------------------------

    async def close(self, session_id: str) -> SessionMetadata:
        """Flush (write-behind), then mark the session closed in both tiers."""
        if self.config.write_policy is WritePolicy.WRITE_BEHIND:
            await self.flush(session_id)
        now = self.clock.now()
        return await self.update_metadata(
            session_id, lambda m: m if m.closed_at else m.model_copy(update={"closed_at": now})
        )

    async def redact(self, session_id: str, index: int) -> Turn:
        """Redact a turn in the archive, then rebuild the hot window if it holds the turn."""
        if self.config.write_policy is not WritePolicy.WRITE_THROUGH:
            # The archive must hold the turn to redact it, and the rebuild replaces the hot
            # window with the archive's: archive the turns not flushed yet first.
            await self.flush(session_id, include_expired=True)
        redacted = await self.durable.redact_turn(session_id, index)
        snap = await self._hot(lambda: self.hot.load(session_id), "redact")
        if isinstance(snap, SessionSnapshot) and any(t.index == index for t in snap.turns):
            await self._resync(session_id)
        return redacted

    async def clear(self, session_id: str) -> int:
        """Delete the session from both tiers: turns, records, and the user's list entry.
        Returns how many turn indexes the session had used."""
        count = await self.durable.next_index(session_id)
        await self._hot(lambda: self.hot.delete(session_id), "clear")
        await self.durable.delete_session(session_id)
        return count

    async def forget_user_sessions(
        self, user_id: str, *, forget: Callable[[str], None] | None = None
    ) -> int:
        """Delete every session of a user from the hot tier, and from the durable tier all
        but the last page of them (the durable purge of the user removes that one, with
        their memories). Returns how many sessions were deleted here. The hot tier is not
        bypassed: a purge must not leave copies behind. ``forget`` is called with each
        session's id once its hot copy is gone (the caller drops what it holds of it)."""
        deleted = 0
        while True:
            refs = await self.durable.list_sessions(user_id, limit=_PURGE_PAGE)
            for ref in refs:
                await self.hot.delete(ref.session_id)
                if forget is not None:
                    forget(ref.session_id)
            if len(refs) < _PURGE_PAGE:
                return deleted
            # More sessions than one page lists: drop these from the list to reach the rest.
            for ref in refs:
                await self.durable.delete_session(ref.session_id)
            deleted += len(refs)

    # -- archive reads -------------------------------------------------------------------

    async def get_turn(self, session_id: str, index: int) -> Turn:
        """One archived turn. Raises NotFoundError if there is none."""
        return await self.durable.get_turn(session_id, index)

    async def holds_turn(self, session_id: str, index: int) -> bool:
        """Whether a tier still holds turn ``index``: the archive, or under write-behind a
        hot copy not flushed yet (expired ones included)."""
        try:
            await self.durable.get_turn(session_id, index)
            return True
        except NotFoundError:
            pass
        if self.config.write_policy is not WritePolicy.WRITE_BEHIND:
            return False
        snap = await self._hot(
            lambda: self.hot.load(session_id, include_expired=True), "holds_turn"
        )
        return isinstance(snap, SessionSnapshot) and any(t.index == index for t in snap.turns)

    async def get_turns(
        self, session_id: str, start: int = 0, end: int | None = None
    ) -> list[Turn]:
        """Archived turns with ``start <= index < end``."""
        return await self.durable.get_turns(session_id, start, end)

    async def list_sessions(self, user_id: str, *, limit: int = 100) -> list[SessionRef]:
        """A user's sessions, newest first."""
        return await self.durable.list_sessions(user_id, limit=limit)


def _archived_as(turn: Turn, held: Turn) -> bool:
    """Whether the archive's ``held`` (at ``turn``'s index) is ``turn``: equal, or its
    redaction (a flush archived it at its hot index, then it was redacted there:
    archiving the hot copy again would undo the redaction). Only at the same index: a
    redaction keeps no content, so elsewhere any turn of the same time, role and size
    would match."""
    return held == turn or (held.redacted and held == turn.redact())


def _found(ours: Sequence[Turn], archived: Sequence[Turn]) -> list[Turn] | None:
    """``ours`` as ``archived`` holds them (equal but for the index), or None if it lacks
    one of them."""
    placed = []
    for turn in ours:
        match = next((a for a in archived if a == turn.model_copy(update={"index": a.index})), None)
        if match is None:
            return None
        placed.append(match)
    return placed


def _placed(turn: Turn, moved: Sequence[Turn]) -> Turn:
    """``turn`` as the archive holds it: renumbered if it is one of ``moved``, else where a
    flush archived it (its own index)."""
    for m in moved:
        if turn == m.model_copy(update={"index": turn.index}):
            return m
    return turn


def _continued(view: SessionView, turns: Sequence[Turn]) -> SessionView:
    """The durable ``view`` followed by ``turns`` (hot turns the archive does not hold, in
    their order), renumbered to continue the archive: what a hot session is rebuilt to
    when it holds turns not flushed yet under numbers the archive does not agree with."""
    base = view.next_index
    moved = [
        t if t.index == base + i else t.model_copy(update={"index": base + i})
        for i, t in enumerate(turns)
    ]
    all_turns = (*view.turns, *moved)
    next_index = base + len(moved)
    return SessionView(
        metadata=derive_metadata(view.metadata, all_turns, next_index),
        turns=all_turns,
        entities=view.entities,
        state=view.state,
        next_index=next_index,
        expires_at=None,
        source="durable",
    )


def _check_owner(session_id: str, owner: str, user_id: str) -> None:
    if owner != user_id:
        raise ValidationError(
            f"session {session_id!r} belongs to another user; use a new session id"
        )


def _entities(data: Mapping[str, JsonValue]) -> dict[str, ActiveEntity]:
    return {kind: ActiveEntity.model_validate(value) for kind, value in data.items()}


def _state(data: Mapping[str, JsonValue]) -> dict[str, StateBlob]:
    blobs: dict[str, StateBlob] = {}
    for name, held in data.items():
        assert isinstance(held, dict)
        blobs[name] = StateBlob.model_validate({"name": name, **held})
    return blobs


def _takes_entities(store: HotStore | DurableStore) -> bool:
    return Capability.ENTITIES_IN_APPEND in store.capabilities


def rebase_entity_change(
    change: EntityChange, expected: int, actual: int, count: int
) -> EntityChange:
    """``change`` with the turn indexes it counted from ``expected`` moved to ``actual``
    (the entities that name one of the ``count`` appended turns): the append's turns got
    other indexes than the writer expected."""
    if expected == actual:
        return change
    shift = actual - expected
    upsert = {
        kind: entity.model_copy(update={"turn_index": entity.turn_index + shift})
        if entity.turn_index is not None and expected <= entity.turn_index < expected + count
        else entity
        for kind, entity in change.upsert.items()
    }
    return EntityChange(upsert=upsert, remove=change.remove)
