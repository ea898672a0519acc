"""The hot and durable tiers working as one session store.

:class:`TieredSessionStore` owns the rules that cross tiers (ARCHITECTURE.md, "Tiers"):

* **Write-through** (default): the durable tier allocates the turn index (it is the only
  tier that survives everything, so it is the one allocator that keeps indexes gap-free
  under concurrent writers and crashes), then the hot tier gets the same turn with that
  index. A turn is acknowledged only after both, or after the durable write alone when the
  hot tier is unreachable and the policy is ``bypass``.
* **Write-behind** (opt-in): the hot tier allocates; the durable tier is flushed every
  ``write_behind_every`` turns, at close, and by the expiry sweeper.
* **Proximity wins**: reads come from the hot tier. A miss (expired, evicted, restarted)
  rebuilds the hot session from the durable tier (last ``window`` turns, metadata, active
  entities, state) and carries on: the caller sees no amnesia, only a ``reload`` in stats.
* **The hot tier is a cache that heals itself**: when concurrent writers reach it out of
  order, or it lost the session, it is rebuilt from the durable tier.

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
from typing import Any, Literal, TypeVar

from tiermem.clock import Clock
from tiermem.errors import (
    BackendTimeoutError,
    BackendUnavailableError,
    ConflictError,
    NotFoundError,
)
from tiermem.models import (
    ActiveEntity,
    JsonValue,
    NewTurn,
    SessionMetadata,
    SessionSnapshot,
    StateBlob,
    Turn,
)
from tiermem.policies.ttl import TtlEvent, TtlPolicy
from tiermem.store.contract import DurableStore, HotStore
from tiermem.tiers.config import HotFailurePolicy, SessionTierConfig, WritePolicy

__all__ = ["SessionView", "TierMetrics", "TieredSessionStore", "derive_metadata"]

logger = logging.getLogger(__name__)

META, ENTITIES, STATE = "metadata", "entities", "state"
_CAS_ATTEMPTS = 20
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
    """Write-behind turns found missing from the hot tier at flush time."""


@dataclass(frozen=True)
class SessionView:
    """A session as the caller sees it, from whichever tier served it."""

    metadata: SessionMetadata
    turns: tuple[Turn, ...]
    entities: dict[str, ActiveEntity]
    state: dict[str, StateBlob]
    next_index: int
    expires_at: datetime | None
    source: Source
    extra: dict[str, Any] = field(default_factory=dict)


def derive_metadata(
    metadata: SessionMetadata, turns: Sequence[Turn], next_index: int
) -> SessionMetadata:
    """Metadata with turn_count and last_activity derived from the log, never stored per turn
    (a per-turn metadata write would race with callers' metadata updates)."""
    last = max((t.timestamp for t in turns), default=metadata.last_activity)
    return metadata.model_copy(
        update={"turn_count": next_index, "last_activity": max(last, metadata.last_activity)}
    )


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
        self.config = config or SessionTierConfig()
        self.metrics = TierMetrics()

    # -- expiry -------------------------------------------------------------------------

    def hot_expiry(
        self,
        metadata: SessionMetadata,
        turn_count: int,
        event: TtlEvent,
        current: datetime | None,
    ) -> datetime | None:
        return self.ttl_policy.expires_at(
            now=self.clock.now(),
            created_at=metadata.created_at,
            turn_count=turn_count,
            user_tier=metadata.user_tier,
            event=event,
            current_expires_at=current,
        )

    def _write_expiry(
        self, metadata: SessionMetadata, turn_count: int, current: datetime | None = None
    ) -> datetime:
        new = self.hot_expiry(metadata, turn_count, "write", current)
        if new is not None:
            return new
        if current is not None:
            return current
        # A policy that never moves the expiry still needs one for the first write.
        fallback = self.hot_expiry(metadata, turn_count, "write", None)
        return fallback or self.clock.now()

    def _durable_expiry(self) -> datetime | None:
        ttl = self.config.durable_ttl
        return None if ttl is None else self.clock.now() + ttl

    # -- the hot tier behind its failure policy ----------------------------------------

    async def _hot(self, op: Callable[[], Awaitable[T]], what: str) -> T | _Bypassed:
        """Run a hot-tier operation under the failure policy; BYPASSED if it was skipped."""
        try:
            return await op()
        except (BackendUnavailableError, BackendTimeoutError) as exc:
            if self.config.on_hot_failure is HotFailurePolicy.RAISE:
                raise
            self.metrics.bypasses += 1
            logger.warning("hot tier unreachable during %s, serving from durable: %s", what, exc)
            return BYPASSED

    # -- open / read ------------------------------------------------------------------------

    async def create(self, metadata: SessionMetadata) -> SessionView:
        """Open a session: the existing one if the durable tier knows it, else a new one.

        A new session is registered in its user's list and its metadata is written to both
        tiers before any turn, so a later hot miss is always detectable.
        """
        existing = await self.view(metadata.session_id)
        if existing is not None:
            return existing
        from tiermem.models import SessionRef

        await self.durable.register_session(
            SessionRef(
                session_id=metadata.session_id,
                user_id=metadata.user_id,
                created_at=metadata.created_at,
            )
        )
        try:
            await self.durable.put_record(
                metadata.session_id,
                META,
                metadata.model_dump(mode="json"),
                expected_version=0,
                expires_at=self._durable_expiry(),
            )
        except ConflictError:
            # Another device opened the same session at the same moment: use theirs.
            view = await self.view(metadata.session_id)
            if view is not None:
                return view
            raise
        expires_at = self._write_expiry(metadata, 0)
        await self._hot(
            lambda: self.hot.put_metadata(metadata.session_id, metadata, expires_at=expires_at),
            "create",
        )
        return SessionView(metadata, (), {}, {}, 0, expires_at, "hot")

    async def view(self, session_id: str, *, refresh_ttl: bool = True) -> SessionView | None:
        """The session from the hot tier, rebuilt from the durable tier on a miss.

        Returns None when neither tier knows the session. A read refreshes the hot expiry
        when the TTL policy says reads do.
        """
        snap = await self._hot(lambda: self.hot.load(session_id), "load")
        if isinstance(snap, SessionSnapshot) and snap.metadata is not None:
            self.metrics.hot_hits += 1
            view = self._from_snapshot(snap, "hot")
            if refresh_ttl:
                await self._refresh_on_read(view)
            return view
        rebuilt = await self.durable_view(session_id)
        if rebuilt is None or snap is BYPASSED:
            return rebuilt
        self.metrics.reloads += 1
        logger.info(
            "hot miss for session %s: reloaded %d turns from durable",
            session_id,
            len(rebuilt.turns),
        )
        await self._write_hot_copy(rebuilt)
        return replace(rebuilt, source="reload")

    async def _refresh_on_read(self, view: SessionView) -> None:
        new = self.hot_expiry(view.metadata, view.next_index, "read", view.expires_at)
        current = view.expires_at
        # A read right after another read or write moves the expiry by seconds: skip that
        # extra write; it changes nothing a user would notice.
        if new is not None and (
            current is None or abs(new - current) >= self.config.read_refresh_granularity
        ):
            await self._hot(
                lambda: self.hot.touch(view.metadata.session_id, expires_at=new), "touch"
            )

    def _from_snapshot(self, snap: SessionSnapshot, source: Source) -> SessionView:
        assert snap.metadata is not None
        return SessionView(
            metadata=derive_metadata(snap.metadata, snap.turns, snap.next_index),
            turns=snap.turns,
            entities=dict(snap.entities),
            state=dict(snap.state),
            next_index=snap.next_index,
            expires_at=snap.expires_at,
            source=source,
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
        metadata = SessionMetadata.model_validate(meta_rec.data)
        entities = {
            k: ActiveEntity.model_validate(v) for k, v in (ent_rec.data if ent_rec else {}).items()
        }
        state = {
            name: StateBlob(
                name=name, data=blob["data"], version=blob["version"], updated_at=blob["updated_at"]
            )
            for name, blob in (state_rec.data if state_rec else {}).items()
        }
        return SessionView(
            metadata=derive_metadata(metadata, turns, next_index),
            turns=tuple(turns),
            entities=entities,
            state=state,
            next_index=next_index,
            expires_at=None,
            source="durable",
        )

    async def _write_hot_copy(self, view: SessionView) -> None:
        """Rebuild the hot session from a durable view. Best effort: the durable tier stays
        the truth, and a concurrent rebuild by another writer is as good as ours."""
        sid = view.metadata.session_id
        expires_at = self._write_expiry(view.metadata, view.next_index)

        async def rebuild() -> None:
            await self.hot.delete(sid)
            try:
                if view.turns:
                    await self.hot.append_turns(
                        sid,
                        view.turns,
                        window=self.config.window,
                        expires_at=expires_at,
                        first_index=view.turns[0].index,
                        metadata=view.metadata,
                        expected_version=0,
                    )
                else:
                    await self.hot.put_metadata(
                        sid, view.metadata, expires_at=expires_at, expected_version=0
                    )
            except ConflictError:
                return  # someone else wrote first; their copy is as fresh as ours
            if view.entities:
                await self.hot.update_entities(sid, view.entities, expires_at=expires_at)
            for name, blob in view.state.items():
                await self.hot.put_state(sid, name, blob.data, expires_at=expires_at)

        await self._hot(rebuild, "reload")

    # -- append ------------------------------------------------------------------------------

    async def append(
        self, metadata: SessionMetadata, turns: Sequence[NewTurn], *, turn_count_hint: int
    ) -> list[Turn]:
        """Add turns; returns them with their indexes once the write policy is satisfied."""
        if self.config.write_policy is WritePolicy.WRITE_THROUGH:
            return await self._append_write_through(metadata, turns)
        return await self._append_write_behind(metadata, turns, turn_count_hint)

    async def _append_write_through(
        self, metadata: SessionMetadata, turns: Sequence[NewTurn]
    ) -> list[Turn]:
        sid = metadata.session_id
        stored = await self.durable.append_turns(sid, turns, expires_at=self._durable_expiry())
        turn_count = stored[-1].index + 1
        expires_at = self._write_expiry(metadata, turn_count)
        for _attempt in range(self.config.hot_conflict_retries + 1):
            try:
                result = await self._hot(
                    lambda: self.hot.append_turns(
                        sid,
                        stored,
                        window=self.config.window,
                        expires_at=expires_at,
                        first_index=stored[0].index,
                    ),
                    "append",
                )
            except ConflictError:
                # Another writer's earlier index has not reached the hot tier yet.
                await asyncio.sleep(0.002 * (_attempt + 1))
                continue
            if not isinstance(result, _Bypassed) and result.version == 1:
                # The hot tier had lost the session (it was created by this write): put the
                # rest of the window back.
                await self._resync(sid)
            return stored
        await self._resync(sid)
        return stored

    async def _resync(self, session_id: str) -> None:
        self.metrics.hot_resyncs += 1
        view = await self.durable_view(session_id)
        if view is not None:
            await self._write_hot_copy(view)

    async def _append_write_behind(
        self, metadata: SessionMetadata, turns: Sequence[NewTurn], turn_count_hint: int
    ) -> list[Turn]:
        sid = metadata.session_id
        expires_at = self._write_expiry(metadata, turn_count_hint + len(turns))
        result = await self._hot(
            lambda: self.hot.append_turns(
                sid, turns, window=self.config.window, expires_at=expires_at
            ),
            "append",
        )
        if isinstance(result, _Bypassed):
            # Hot tier down: the durable tier is all we have, so write through.
            return await self.durable.append_turns(sid, turns, expires_at=self._durable_expiry())
        if result.version == 1:
            # The hot session was absent, so its numbering may not continue the archive's.
            durable_next = await self.durable.next_index(sid)
            if result.turns[0].index != durable_next:
                await self.hot.delete(sid)
                await self._resync(sid)
                return await self._append_write_behind(metadata, turns, durable_next)
        every = self.config.write_behind_every
        if result.next_index // every != result.turns[0].index // every:
            await self.flush(sid)
        return list(result.turns)

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
            lost = pending[0].index - durable_next
            self.metrics.lost_turns += lost
            logger.error("write-behind lost %d turns of session %s before flush", lost, session_id)
            return 0
        try:
            written = await self.durable.append_turns(
                session_id, pending, first_index=durable_next, expires_at=self._durable_expiry()
            )
        except ConflictError:
            return 0  # another flusher got there first
        self.metrics.flushes += 1
        self.metrics.flushed_turns += len(written)
        return len(written)

    # -- metadata, entities, state ------------------------------------------------------

    async def _cas_record(
        self,
        session_id: str,
        kind: str,
        change: Callable[[dict[str, JsonValue] | None], dict[str, JsonValue]],
    ) -> tuple[dict[str, JsonValue], int]:
        """Read-modify-write a durable record with compare-and-set, retrying on conflict."""
        for attempt in range(_CAS_ATTEMPTS):
            current = await self.durable.get_record(session_id, kind)
            new = change(current.data if current else None)
            try:
                record = await self.durable.put_record(
                    session_id,
                    kind,
                    new,
                    expected_version=current.version if current else 0,
                    expires_at=self._durable_expiry(),
                )
            except ConflictError:
                await asyncio.sleep(0.001 * (attempt + 1))
                continue
            return record.data, record.version
        raise ConflictError(
            f"record {kind!r} of session {session_id!r} kept changing under "
            f"{_CAS_ATTEMPTS} attempts; try again",
        )

    async def update_metadata(
        self, session_id: str, change: Callable[[SessionMetadata], SessionMetadata]
    ) -> SessionMetadata:
        """Apply ``change`` to the metadata, compare-and-set with retry; both tiers updated."""

        def apply(data: dict[str, JsonValue] | None) -> dict[str, JsonValue]:
            if data is None:
                raise NotFoundError(f"session {session_id!r} does not exist; open it first")
            return change(SessionMetadata.model_validate(data)).model_dump(mode="json")

        data, version = await self._cas_record(session_id, META, apply)
        metadata = SessionMetadata.model_validate(data)
        await self._sync_hot_metadata(session_id, metadata, version)
        return metadata

    async def _sync_hot_metadata(
        self, session_id: str, metadata: SessionMetadata, version: int
    ) -> None:
        """Copy metadata to the hot tier. Two updaters can reach it out of order, so after
        writing, the writer checks the durable version and re-copies if it was overtaken:
        the last one to finish leaves the newest metadata in the hot tier."""
        for _ in range(_CAS_ATTEMPTS):
            snap = await self._hot(lambda: self.hot.load(session_id), "metadata")
            if not isinstance(snap, SessionSnapshot):
                return  # absent or unreachable: the next read reloads from durable
            expires_at = snap.expires_at
            await self._hot(
                partial(self.hot.put_metadata, session_id, metadata, expires_at=expires_at),
                "metadata",
            )
            latest = await self.durable.get_record(session_id, META)
            if latest is None or latest.version == version:
                return
            metadata, version = SessionMetadata.model_validate(latest.data), latest.version

    async def update_entities(
        self,
        metadata: SessionMetadata,
        upsert: Mapping[str, ActiveEntity],
        remove: Collection[str] = (),
        *,
        turn_count_hint: int = 0,
    ) -> None:
        """Merge active entities into both tiers (a new value of a kind replaces the old)."""
        sid = metadata.session_id
        if not upsert and not remove:
            return

        def merge(data: dict[str, JsonValue] | None) -> dict[str, JsonValue]:
            merged = dict(data or {})
            for kind in remove:
                merged.pop(kind, None)
            merged.update({k: v.model_dump(mode="json") for k, v in upsert.items()})
            return merged

        await self._cas_record(sid, ENTITIES, merge)
        expires_at = self._write_expiry(metadata, turn_count_hint)
        await self._hot(
            lambda: self.hot.update_entities(sid, upsert, remove, expires_at=expires_at),
            "entities",
        )

    async def put_state(
        self,
        metadata: SessionMetadata,
        name: str,
        data: Mapping[str, JsonValue],
        *,
        expected_version: int | None,
        turn_count_hint: int = 0,
    ) -> StateBlob:
        """Write a state blob: compare-and-set in the hot tier, then copied to durable.

        With the hot tier unreachable (bypass), the durable copy does the compare-and-set.
        """
        sid = metadata.session_id
        expires_at = self._write_expiry(metadata, turn_count_hint)
        blob = await self._hot(
            lambda: self.hot.put_state(
                sid, name, data, expires_at=expires_at, expected_version=expected_version
            ),
            "state",
        )

        def merge(current: dict[str, JsonValue] | None) -> dict[str, JsonValue]:
            blobs = dict(current or {})
            held = blobs.get(name)
            held_version = held["version"] if isinstance(held, dict) else 0
            if isinstance(blob, StateBlob):
                if held_version >= blob.version:
                    return blobs  # a newer write already reached durable
                new_version, updated = blob.version, blob.updated_at
            else:
                if expected_version is not None and held_version != expected_version:
                    raise ConflictError(
                        f"state {name!r} of session {sid!r} is at version {held_version}, "
                        f"not {expected_version}",
                        expected=expected_version,
                        actual=held_version,
                    )
                new_version, updated = held_version + 1, self.clock.now()
            blobs[name] = {
                "version": new_version,
                "data": dict(data),
                "updated_at": updated.isoformat(),
            }
            return blobs

        stored, _ = await self._cas_record(sid, STATE, merge)
        if isinstance(blob, StateBlob):
            return blob
        held = stored[name]
        assert isinstance(held, dict)
        return StateBlob(
            name=name, data=held["data"], version=held["version"], updated_at=held["updated_at"]
        )

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
        redacted = await self.durable.redact_turn(session_id, index)
        snap = await self._hot(lambda: self.hot.load(session_id), "redact")
        if isinstance(snap, SessionSnapshot) and any(t.index == index for t in snap.turns):
            await self._hot(lambda: self.hot.delete(session_id), "redact")
            await self._resync(session_id)
        return redacted

    async def clear(self, session_id: str) -> None:
        """Delete the session from both tiers: turns, records, and the user's list entry."""
        await self._hot(lambda: self.hot.delete(session_id), "clear")
        await self.durable.delete_session(session_id)
