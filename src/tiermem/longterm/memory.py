"""LongTermMemory: the API over a user's long-term memories.

It owns every write to them, so the rules below hold whoever calls (SDK, service hook,
REST, MCP). Ids, limits, models and the pure decisions are in
:mod:`tiermem.longterm.records`.

* **Dedup.** :meth:`LongTermMemory.remember` gives a record an id computed from its type
  and its normalised content (NFKC, case-folded, whitespace collapsed, trailing
  punctuation dropped: ``dedup_memory_id``) and writes it only if absent
  (``put_memory(expected_version=0)``). Remembering the same fact again, even from two
  tasks at once, yields one record: the repeat merges into it (new tags added, importance
  raised, retention extended, and its provenance appended to ``metadata["also_from"]``, at
  most ``MAX_ALSO_FROM`` entries, so where else it was said is not lost).
* **Preferences are slots.** The current value for ``(user, key)`` lives at
  ``preference_slot_id(key)`` and is replaced by compare-and-set (read version v, write
  v + 1). Before the write, the value being replaced is copied to a history record at
  ``preference_history_id`` (``<slot>-v<v>``, ``invalid_from`` = now). The id is
  deterministic, so two writers racing on one version write one history record; the race
  seed 000's read-then-write ``store_preference`` lost is a retry here.
* **Supersession** hides a record (``invalid_from`` = now, ``metadata["superseded_by"]``)
  and adds its successor (``provenance.memory_ids`` and ``metadata["supersedes"]`` point
  back). Nothing is deleted: ``list(include_superseded=True)`` shows the history.
* **Change log.** Every write appends one entry (a record of the internal type
  ``CHANGE_LOG_TYPE`` = ``_change``, kept 365 days): op, memory id and type, time,
  summary. Entries never hold memory content, so forgetting a memory leaves no copy of it
  behind in the log.
* **The search index follows the durable store.** After each write the record is read
  back and indexed (or removed from the index if it is hidden), and read again until it
  did not change meanwhile: concurrent writers always leave the index at the newest
  version. Internal records and superseded ones are never indexed.
* **Forgetting** deletes from the durable store and the index. :meth:`forget_session`
  reads the user's whole partition (it is not on the recall path; see its docstring).

Errors: every method validates ids and sizes before any I/O and raises
:class:`~tiermem.errors.ValidationError` with advice; backend failures surface as
:class:`~tiermem.errors.BackendError`; compare-and-set loops that keep losing raise
:class:`~tiermem.errors.ConflictError`.
"""

from __future__ import annotations

import asyncio
import builtins
import itertools
import logging
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from tiermem.clock import Clock, IdFactory
from tiermem.errors import ConflictError, NotFoundError, UnsupportedCapabilityError, ValidationError
from tiermem.llm.embeddings import Embedder
from tiermem.longterm.detect import DetectedMemory
from tiermem.longterm.hits import RecallHit
from tiermem.longterm.index import DocKind, SearchIndex
from tiermem.longterm.recall import memory_doc, turn_doc_id, turn_docs
from tiermem.longterm.records import (
    CHANGE_LOG_RETENTION,
    CHANGE_LOG_TYPE,
    MAX_CONTENT_BYTES,
    MAX_KEY_CHARS,
    MAX_VALUE_BYTES,
    ChangeEntry,
    ChangeOp,
    Sources,
    UserMemoryStats,
    check_importance,
    check_limit,
    check_metadata,
    check_provenance,
    check_tags,
    check_text,
    check_time,
    dedup_memory_id,
    is_hidden,
    is_live,
    is_preference_slot,
    merge_repeat,
    normalize_preference_key,
    plan_forget_session,
    preference_history_id,
    preference_slot_id,
)
from tiermem.longterm.types import MemoryType, MemoryTypeRegistry, is_internal_type
from tiermem.models import JsonValue, MemoryRecord, Provenance, Turn
from tiermem.retry import pause
from tiermem.store.contract import DurableStore
from tiermem.store.keys import validate_id
from tiermem.tokens import TiktokenCounter, TokenCounter

if TYPE_CHECKING:
    from tiermem.longterm.context import UserContext
    from tiermem.tokens import ModelRegistry

__all__ = ["LongTermMemory", "MemoryRecaller"]

logger = logging.getLogger(__name__)

_CAS_ATTEMPTS = 32
_PAGE = 500
_MEMORY_SCOPE: tuple[DocKind, ...] = ("memory",)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
Records = list[MemoryRecord]  # the class has a method named ``list``


def _us(value: datetime) -> int:
    return (value - _EPOCH) // timedelta(microseconds=1)


class MemoryRecaller(Protocol):
    """What :meth:`LongTermMemory.recall` delegates to
    (:class:`tiermem.longterm.recall.Recaller`)."""

    async def recall(
        self,
        user_id: str,
        query: str,
        *,
        types: Collection[str] | None = None,
        min_importance: float = 0.0,
        since: datetime | None = None,
        until: datetime | None = None,
        k: int = 5,
        scope: Collection[DocKind] = _MEMORY_SCOPE,
    ) -> list[RecallHit]: ...

    async def aclose(self) -> None:
        """Finish background work (e.g. access-count flushes)."""
        ...


# ---------------------------------------------------------------- the API


class LongTermMemory:
    """A user's long-term memories over a durable store and a search index.

    One instance serves every user and is safe for concurrent tasks: all coordination goes
    through the durable store's compare-and-set.
    """

    def __init__(
        self,
        durable: DurableStore,
        index: SearchIndex,
        *,
        clock: Clock,
        ids: IdFactory,
        types: MemoryTypeRegistry | None = None,
        embedder: Embedder | None = None,
        recaller: MemoryRecaller | None = None,
        tokens: TokenCounter | None = None,
        models: ModelRegistry | None = None,
    ) -> None:
        self.durable = durable
        self.index = index
        self.clock = clock
        self.ids = ids
        self.types = types or MemoryTypeRegistry()
        self.embedder = embedder
        self.recaller = recaller
        self.tokens = tokens or TiktokenCounter()
        self._models = models
        self._seq = itertools.count()
        self._page = _PAGE

    # -- remember ---------------------------------------------------------------------

    async def remember(
        self,
        user_id: str,
        content: str,
        *,
        memory_type: str = "fact",
        tags: Iterable[str] = (),
        importance: float | None = None,
        metadata: Mapping[str, JsonValue] | None = None,
        provenance: Provenance | None = None,
        valid_from: datetime | None = None,
    ) -> MemoryRecord:
        """Remember ``content``; the same content (normalised) of the same type is one record.

        ``importance`` defaults to the type's, retention (``expires_at``) is the type's,
        ``provenance`` defaults to ``Provenance(source="explicit")``. A repeat returns the
        existing record, merged (see the module docstring); a superseded record said again
        is revived.

        Raises:
            ValidationError: a bad id, empty or oversized content, an unknown or internal
                type, bad tags, importance, metadata or provenance.
            ConflictError: the record kept changing under 32 attempts.
        """
        validate_id(user_id, what="user_id")
        text = check_text(content, what="content", limit=MAX_CONTENT_BYTES)
        kind = self._user_type(memory_type)
        candidate = self._new_record(
            user_id,
            text,
            kind,
            memory_id=dedup_memory_id(kind.name, text),
            tags=check_tags(tags),
            importance=check_importance(importance, kind.importance),
            metadata=check_metadata(metadata),
            provenance=check_provenance(provenance, "explicit"),
            valid_from=check_time(valid_from, what="valid_from"),
        )
        stored, what = await self._create_or_merge(
            candidate, importance_given=importance is not None
        )
        await self._sync_index(user_id, stored.memory_id)
        if what:
            await self._log(user_id, "remember", stored, f"{what} ({stored.memory_type})")
        return stored

    def _new_record(
        self,
        user_id: str,
        content: str,
        kind: MemoryType,
        *,
        memory_id: str,
        tags: tuple[str, ...],
        importance: float,
        metadata: dict[str, JsonValue],
        provenance: Provenance,
        valid_from: datetime | None,
    ) -> MemoryRecord:
        now = self.clock.now()
        return MemoryRecord(
            memory_id=memory_id,
            user_id=user_id,
            memory_type=kind.name,
            content=content,
            tags=tags,
            metadata=metadata,
            importance=importance,
            created_at=now,
            expires_at=None if kind.retention is None else now + kind.retention,
            provenance=provenance,
            valid_from=valid_from or now,
        )

    async def _create_or_merge(
        self, candidate: MemoryRecord, *, importance_given: bool
    ) -> tuple[MemoryRecord, str]:
        """Write ``candidate`` if its id is free, else merge it into the record there.
        Returns the stored record and what was done ("" if nothing was written)."""
        user_id, memory_id = candidate.user_id, candidate.memory_id
        for attempt in range(_CAS_ATTEMPTS):
            existing: MemoryRecord | None = None
            if self.embedder is not None and candidate.embedding is None:
                # Look first, so that a repeat costs no embedding call.
                existing = await self.durable.get_memory(user_id, memory_id)
                if existing is None:
                    candidate = await self._embedded(candidate)
            if existing is None:
                try:
                    return await self.durable.put_memory(candidate, expected_version=0), "created"
                except ConflictError:
                    existing = await self.durable.get_memory(user_id, memory_id)
                    if existing is None:
                        continue  # deleted or expired in between: create it again
            merged, what = merge_repeat(
                existing, candidate, importance_given=importance_given, now=self.clock.now()
            )
            if merged is None:
                return existing, ""
            try:
                return await self.durable.put_memory(
                    merged, expected_version=existing.version
                ), what
            except ConflictError:
                await pause(attempt)
        raise ConflictError(
            f"memory {memory_id!r} of user {user_id!r} kept changing under {_CAS_ATTEMPTS} "
            "attempts; try again"
        )

    async def _embedded(self, record: MemoryRecord) -> MemoryRecord:
        if self.embedder is None:
            return record
        (vector,) = await self.embedder.embed([record.content])
        return record.model_copy(
            update={"embedding": tuple(vector), "embedding_model": self.embedder.model_id}
        )

    # -- preferences ----------------------------------------------------------------------

    async def upsert_preference(
        self,
        user_id: str,
        key: str,
        value: str,
        *,
        text: str | None = None,
        provenance: Provenance | None = None,
        importance: float | None = None,
        tags: Iterable[str] = (),
        metadata: Mapping[str, JsonValue] | None = None,
    ) -> MemoryRecord:
        """Set the user's preference ``key`` to ``value``, atomically; the value it replaces
        goes to history (:meth:`preference_history`).

        ``text`` is what recall and the user context show (default ``"<key>: <value>"``).
        Setting the value it already has changes nothing and returns the current record.
        Concurrent upserts of one key each land exactly once, in some order: the last one
        is current, every other value is in history.

        Raises:
            ValidationError: a bad id, an empty or oversized key, value or text, bad
                provenance, importance, tags or metadata.
            ConflictError: the key kept changing under 32 attempts.
        """
        validate_id(user_id, what="user_id")
        raw_key = check_text(key, what="preference key", limit=MAX_KEY_CHARS)
        norm_key = normalize_preference_key(raw_key)
        validate_id(norm_key, what="preference key")
        value = check_text(value, what="preference value", limit=MAX_VALUE_BYTES)
        content = check_text(
            text if text is not None else f"{norm_key}: {value}",
            what="preference text",
            limit=MAX_CONTENT_BYTES,
        )
        prov = check_provenance(provenance, "explicit")
        tag_tuple = check_tags(tags)
        extra = check_metadata(metadata)
        given = None if importance is None else check_importance(importance, 0.0)
        kind = self.types.get("preference")
        slot_id = preference_slot_id(norm_key)
        embedding: tuple[tuple[float, ...], str] | None = None
        for attempt in range(_CAS_ATTEMPTS):
            current = await self.durable.get_memory(user_id, slot_id)
            if (
                current is not None
                and current.metadata.get("preference_value") == value
                and current.content == content
                and (given is None or given == current.importance)
            ):
                return current
            if self.embedder is not None and embedding is None:
                (vector,) = await self.embedder.embed([content])
                embedding = (tuple(vector), self.embedder.model_id)
            now = self.clock.now()
            new = MemoryRecord(
                memory_id=slot_id,
                user_id=user_id,
                memory_type=kind.name,
                content=content,
                tags=tag_tuple,
                metadata={**extra, "preference_key": norm_key, "preference_value": value},
                importance=given
                if given is not None
                else (current.importance if current else kind.importance),
                created_at=now,
                accessed_at=current.accessed_at if current else None,
                access_count=current.access_count if current else 0,
                expires_at=None if kind.retention is None else now + kind.retention,
                provenance=prov,
                valid_from=now,
                version=current.version + 1 if current else 1,
                embedding=embedding[0] if embedding else None,
                embedding_model=embedding[1] if embedding else None,
            )
            if current is not None:
                await self._write_history(current, now)
            try:
                stored = await self.durable.put_memory(
                    new, expected_version=current.version if current else 0
                )
            except ConflictError:
                await pause(attempt)
                continue
            await self._sync_index(user_id, slot_id)
            summary = (
                f"preference set (v{stored.version})"
                if current is None
                else f"preference updated v{current.version} -> v{stored.version}; "
                f"v{current.version} kept in history"
            )
            await self._log(user_id, "upsert", stored, summary)
            return stored
        raise ConflictError(
            f"preference {norm_key!r} of user {user_id!r} kept changing under "
            f"{_CAS_ATTEMPTS} attempts; try again"
        )

    async def _write_history(self, current: MemoryRecord, now: datetime) -> None:
        """Copy the slot's value at ``current.version`` to its history record. Idempotent:
        every writer that read this version writes the same record."""
        history = current.model_copy(
            update={
                "memory_id": preference_history_id(current.memory_id, current.version),
                "version": 1,
                "invalid_from": now,
                "metadata": {
                    **current.metadata,
                    "history_of": current.memory_id,
                    "slot_version": current.version,
                },
            }
        )
        for _ in range(_CAS_ATTEMPTS):
            try:
                await self.durable.put_memory(history, expected_version=0)
                return
            except ConflictError:
                there = await self.durable.get_memory(current.user_id, history.memory_id)
            if there is None:
                continue  # collected in between: write it again
            if there.created_at == current.created_at and there.content == current.content:
                return  # a concurrent writer copied the same version
            # A stale copy from an earlier life of the slot (direct store edits): replace it.
            history = history.model_copy(update={"version": there.version + 1})
            try:
                await self.durable.put_memory(history, expected_version=there.version)
                return
            except ConflictError:
                history = history.model_copy(update={"version": 1})
        raise ConflictError(f"history record {history.memory_id!r} kept changing; try again")

    async def get_preference(self, user_id: str, key: str) -> MemoryRecord | None:
        """The current record of preference ``key``, or None."""
        validate_id(user_id, what="user_id")
        norm_key = normalize_preference_key(
            check_text(key, what="preference key", limit=MAX_KEY_CHARS)
        )
        return await self.durable.get_memory(user_id, preference_slot_id(norm_key))

    async def preference_history(self, user_id: str, key: str, *, limit: int = 100) -> Records:
        """The earlier values of preference ``key``, newest first (not the current one).

        Reads history records by their ids (no query over the partition); values that
        expired, or were forgotten with their session, are left out.
        """
        current = await self.get_preference(user_id, key)
        check_limit(limit)
        if current is None:
            return []
        versions = range(current.version - 1, max(0, current.version - 1 - limit), -1)
        found = await asyncio.gather(
            *(
                self.durable.get_memory(user_id, preference_history_id(current.memory_id, v))
                for v in versions
            )
        )
        return [r for r in found if r is not None]

    async def preferences(self, user_id: str, *, limit: int = 100) -> Records:
        """The user's current preferences (slots and plainly remembered ones), newest first."""
        return await self.list(user_id, types=["preference"], limit=limit)

    # -- supersede --------------------------------------------------------------------------

    async def supersede(
        self,
        user_id: str,
        memory_id: str,
        new_content: str,
        *,
        memory_type: str | None = None,
        tags: Iterable[str] | None = None,
        importance: float | None = None,
        metadata: Mapping[str, JsonValue] | None = None,
        provenance: Provenance | None = None,
    ) -> MemoryRecord:
        """Replace a memory by a new one; the old one stays in history, hidden from recall.

        The old record gets ``invalid_from`` = now and ``metadata["superseded_by"]``; the new
        one (type, tags and importance default to the old one's) has the old id in
        ``provenance.memory_ids`` and ``metadata["supersedes"]``. The old record is marked
        first, then the new one written: a retry after a crash in between finishes the job.

        Raises:
            NotFoundError: no such memory (or it expired).
            ValidationError: bad input; the memory is a preference (use
                :meth:`upsert_preference`) or internal; the new content is the old content.
            ConflictError: the memory was already superseded by something else.
        """
        validate_id(user_id, what="user_id")
        validate_id(memory_id, what="memory_id")
        text = check_text(new_content, what="new_content", limit=MAX_CONTENT_BYTES)
        extra = check_metadata(metadata)
        prov = check_provenance(provenance, "explicit")
        new_tags = None if tags is None else check_tags(tags)
        for attempt in range(_CAS_ATTEMPTS):
            old = await self.durable.get_memory(user_id, memory_id)
            if old is None:
                raise NotFoundError(f"memory {memory_id!r} of user {user_id!r} does not exist")
            if is_internal_type(old.memory_type) or "preference_key" in old.metadata:
                raise ValidationError(
                    f"memory {memory_id!r} is a preference slot or internal record; change "
                    "preferences with upsert_preference"
                )
            kind = self._user_type(memory_type or old.memory_type)
            new_id = dedup_memory_id(kind.name, text)
            if new_id == old.memory_id:
                raise ValidationError(
                    "the new content is the old content (after normalisation); to add tags "
                    "or raise importance, remember it again"
                )
            now = self.clock.now()
            if old.invalid_from is not None and old.invalid_from <= now:
                if old.metadata.get("superseded_by") == new_id:
                    break  # finishing a supersession that was interrupted
                raise ConflictError(
                    f"memory {memory_id!r} was already superseded by "
                    f"{old.metadata.get('superseded_by')!r}; supersede that one instead",
                    expected=None,
                    actual=old.metadata.get("superseded_by"),
                )
            hidden = old.model_copy(
                update={
                    "invalid_from": now,
                    "version": old.version + 1,
                    "metadata": {**old.metadata, "superseded_by": new_id},
                }
            )
            try:
                await self.durable.put_memory(hidden, expected_version=old.version)
                break
            except ConflictError:
                await pause(attempt)  # e.g. access tracking wrote it: read again
        else:
            raise ConflictError(f"memory {memory_id!r} kept changing; try again")
        ids = prov.memory_ids if memory_id in prov.memory_ids else (*prov.memory_ids, memory_id)
        candidate = self._new_record(
            user_id,
            text,
            kind,
            memory_id=new_id,
            tags=old.tags if new_tags is None else new_tags,
            importance=check_importance(importance, old.importance),
            metadata={**extra, "supersedes": memory_id},
            provenance=prov.model_copy(update={"memory_ids": ids}),
            valid_from=None,
        )
        stored, _ = await self._create_or_merge(candidate, importance_given=importance is not None)
        await asyncio.gather(
            self._sync_index(user_id, memory_id), self._sync_index(user_id, stored.memory_id)
        )
        await self._log(
            user_id, "supersede", old, f"superseded by {stored.memory_id}", related=stored.memory_id
        )
        return stored

    # -- read ---------------------------------------------------------------------------------

    async def get(self, user_id: str, memory_id: str) -> MemoryRecord | None:
        """One memory (current, superseded or history), or None if absent or expired."""
        validate_id(user_id, what="user_id")
        validate_id(memory_id, what="memory_id")
        return await self.durable.get_memory(user_id, memory_id)

    async def list(
        self,
        user_id: str,
        *,
        types: Collection[str] | None = None,
        include_superseded: bool = False,
        limit: int = 100,
    ) -> Records:
        """The user's memories of ``types`` (default: every registered type), newest first:
        current ones, and with ``include_superseded`` also superseded ones and preference
        history. Internal records are never listed.

        Raises:
            ValidationError: a bad id or limit, an unknown or internal type.
        """
        validate_id(user_id, what="user_id")
        check_limit(limit)
        # Ask for the registered types, so that the change log is never read here.
        names = self.types.names() if types is None else types
        wanted = [self._user_type(t).name for t in names]
        now = self.clock.now()
        out: Records = []
        async for page in self._scan(user_id, memory_types=wanted):
            for record in page:
                if is_internal_type(record.memory_type):
                    continue
                if include_superseded or not is_hidden(record, now):
                    out.append(record)
                    if len(out) == limit:
                        return out
        return out

    async def changes(
        self, user_id: str, *, since: datetime | None = None, limit: int = 100
    ) -> builtins.list[ChangeEntry]:
        """The user's change log, newest first; ``since`` is inclusive."""
        validate_id(user_id, what="user_id")
        check_limit(limit)
        check_time(since, what="since")
        records = await self.durable.query_memories(
            user_id, memory_types=[CHANGE_LOG_TYPE], since=since, limit=limit
        )
        entries = [_entry(r) for r in records]
        return [e for e in entries if e is not None]

    async def recall(
        self,
        user_id: str,
        query: str,
        *,
        types: Collection[str] | None = None,
        min_importance: float = 0.0,
        since: datetime | None = None,
        until: datetime | None = None,
        k: int = 5,
        scope: Collection[DocKind] = _MEMORY_SCOPE,
    ) -> builtins.list[RecallHit]:
        """The memories most relevant to ``query`` (delegated to the recaller).

        Raises:
            UnsupportedCapabilityError: no recaller was configured.
        """
        if self.recaller is None:
            raise UnsupportedCapabilityError(
                "this LongTermMemory has no recaller; build it with "
                "recaller=tiermem.longterm.recall.Recaller(...)"
            )
        return await self.recaller.recall(
            user_id,
            query,
            types=types,
            min_importance=min_importance,
            since=since,
            until=until,
            k=k,
            scope=scope,
        )

    async def build_user_context(
        self, user_id: str, query: str, *, budget_tokens: int, model: str | None = None
    ) -> UserContext:
        """A compact block of what is known about the user, within ``budget_tokens`` (see
        :func:`tiermem.longterm.context.build_user_context`)."""
        from tiermem.longterm.context import build_user_context

        return await build_user_context(
            self, user_id, query, budget_tokens=budget_tokens, model=model, models=self._models
        )

    async def stats(self, user_id: str) -> UserMemoryStats:
        """Counts, tokens and ages of the user's memories (reads the whole partition)."""
        validate_id(user_id, what="user_id")
        now = self.clock.now()
        by_type: dict[str, int] = {}
        tokens = superseded = expired = changes = 0
        oldest: datetime | None = None
        newest: datetime | None = None
        async for page in self._scan(user_id, include_expired=True):
            for record in page:
                if not is_live(record, now):
                    expired += 1
                elif record.memory_type == CHANGE_LOG_TYPE:
                    changes += 1
                elif is_hidden(record, now):
                    superseded += 1
                else:
                    by_type[record.memory_type] = by_type.get(record.memory_type, 0) + 1
                    tokens += self.tokens.count(record.content)
                    oldest = min(oldest or record.created_at, record.created_at)
                    newest = max(newest or record.created_at, record.created_at)
        return UserMemoryStats(
            user_id=user_id,
            total=sum(by_type.values()),
            by_type=dict(sorted(by_type.items())),
            total_tokens=tokens,
            oldest_created_at=oldest,
            newest_created_at=newest,
            superseded=superseded,
            expired_awaiting_collection=expired,
            change_log_entries=changes,
        )

    # -- auto-detection -------------------------------------------------------------------

    async def remember_detected(
        self, user_id: str, drafts: Sequence[DetectedMemory], *, provenance: Provenance
    ) -> Records:
        """Write drafts from :mod:`tiermem.longterm.detect`, in order: preferences through
        :meth:`upsert_preference`, the rest through :meth:`remember`. Drafts the user asked
        for (``explicit``) get provenance source ``explicit``, the others keep
        ``provenance`` (source ``auto`` from the session hook)."""
        written: Records = []
        for draft in drafts:
            source = (
                provenance.model_copy(update={"source": "explicit"})
                if draft.explicit
                else provenance
            )
            if draft.memory_type == "preference" and draft.key is not None:
                record = await self.upsert_preference(
                    user_id,
                    draft.key,
                    draft.value or draft.content,
                    text=draft.content,
                    provenance=source,
                    importance=draft.importance,
                    tags=draft.tags,
                    metadata={"detected_by": draft.reason},
                )
            else:
                record = await self.remember(
                    user_id,
                    draft.content,
                    memory_type=draft.memory_type,
                    tags=draft.tags,
                    importance=draft.importance,
                    metadata={"detected_by": draft.reason},
                    provenance=source,
                )
            written.append(record)
        return written

    # -- forget -------------------------------------------------------------------------------

    async def forget(self, user_id: str, memory_id: str) -> bool:
        """Delete one memory from the durable store and the index; False if there was none.

        Forgetting a preference slot forgets its history too. Memories derived from this one
        stay (use :meth:`forget_session` for a cascade).

        Raises:
            ValidationError: a bad id, or a change-log entry (those go with
                :meth:`purge_user` or their retention).
        """
        validate_id(user_id, what="user_id")
        validate_id(memory_id, what="memory_id")
        record = await self.durable.get_memory(user_id, memory_id)
        if record is not None and is_internal_type(record.memory_type):
            raise ValidationError(
                f"{memory_id!r} is a change-log entry; it goes with purge_user or its retention"
            )
        doomed = [memory_id]
        if record is not None and is_preference_slot(record):
            doomed += [preference_history_id(memory_id, v) for v in range(1, record.version)]
        deleted = await asyncio.gather(*(self.durable.delete_memory(user_id, i) for i in doomed))
        await self.index.remove(user_id, doomed)
        if deleted[0]:
            kind = record.memory_type if record is not None else "unknown"
            await self._log_raw(user_id, "forget", memory_id, kind, "forgotten")
        return deleted[0]

    async def forget_session(self, user_id: str, session_id: str) -> int:
        """Forget what the user said in a session; returns how many memories were forgotten.

        Deleted: every memory whose ``provenance.session_id`` is the session, and, until
        nothing changes, every memory derived from a deleted one (``provenance.memory_ids``:
        summaries, roll-ups, successors). Expired records not yet collected count too.
        Exceptions that keep what was also said elsewhere:

        * a memory repeated in other sessions (``metadata["also_from"]``) stays, attributed
          to the next of them, with this session dropped from its sources;
        * a preference whose current value came from the session rolls back to its newest
          earlier value that did not (or is deleted if there is none); history values from
          the session are deleted.

        This reads the user's whole partition (a query, paged): acceptable for forgetting,
        which is rare and not on the recall path. A memory written concurrently from the
        session may escape; call it again after the session is closed.
        """
        validate_id(user_id, what="user_id")
        validate_id(session_id, what="session_id")
        records = {
            r.memory_id: r async for page in self._scan(user_id, include_expired=True) for r in page
        }
        plan = plan_forget_session(records, session_id)
        for slot_id, history_id in list(plan.rollbacks.items()):
            if not await self._roll_back(records[slot_id], records[history_id], session_id):
                # A value from elsewhere arrived meanwhile: it stands, nothing to forget.
                del plan.rollbacks[slot_id]
                plan.forgotten.discard(slot_id)
        gone = plan.deletions
        await asyncio.gather(*(self.durable.delete_memory(user_id, i) for i in gone))
        if gone:
            await self.index.remove(user_id, gone)
        for memory_id, sources in plan.rewrites.items():
            await self._replace_sources(user_id, memory_id, sources)
        summary = f"forgotten with session {session_id}"
        await asyncio.gather(
            *(
                self._log_raw(user_id, "forget", i, records[i].memory_type, summary)
                for i in sorted(plan.forgotten)
            )
        )
        return len(plan.forgotten)

    async def _roll_back(self, slot: MemoryRecord, history: MemoryRecord, session_id: str) -> bool:
        """Make ``history``'s value the slot's current one again. False if the slot got a
        value from elsewhere meanwhile (that value stands)."""
        current: MemoryRecord | None = slot
        for attempt in range(_CAS_ATTEMPTS):
            if current is None or current.provenance.session_id != session_id:
                return False
            restored = history.model_copy(
                update={
                    "memory_id": slot.memory_id,
                    "version": current.version + 1,
                    "invalid_from": None,
                    "valid_from": self.clock.now(),
                    "metadata": {
                        k: v
                        for k, v in history.metadata.items()
                        if k not in ("history_of", "slot_version")
                    },
                }
            )
            try:
                await self.durable.put_memory(restored, expected_version=current.version)
            except ConflictError:
                await pause(attempt)  # e.g. access counts were written: read again
                current = await self.durable.get_memory(slot.user_id, slot.memory_id)
                continue
            await self._sync_index(slot.user_id, slot.memory_id)
            return True
        raise ConflictError(f"preference {slot.memory_id!r} kept changing; try again")

    async def _replace_sources(self, user_id: str, memory_id: str, sources: Sources) -> None:
        """Make ``sources[0]`` the record's provenance and the rest its ``also_from``."""
        primary = Provenance.model_validate({k: v for k, v in sources[0].items() if k != "at"})
        for attempt in range(_CAS_ATTEMPTS):
            record = await self.durable.get_memory(user_id, memory_id)
            if record is None:
                return
            metadata = {**record.metadata, "also_from": sources[1:]}
            if not sources[1:]:
                metadata.pop("also_from")
            try:
                await self.durable.put_memory(
                    record.model_copy(
                        update={
                            "provenance": primary.model_copy(
                                update={"memory_ids": record.provenance.memory_ids}
                            ),
                            "metadata": metadata,
                            "version": record.version + 1,
                        }
                    ),
                    expected_version=record.version,
                )
                return
            except ConflictError:
                await pause(attempt)
        raise ConflictError(f"memory {memory_id!r} kept changing; try again")

    async def index_turns(
        self,
        user_id: str,
        session_id: str,
        turns: Sequence[Turn],
        *,
        expires_at: datetime | None,
    ) -> None:
        """Index archived turns for episodic recall; their documents expire with them."""
        await self.index.upsert(turn_docs(user_id, session_id, turns, expires_at=expires_at))

    async def unindex_turns(self, user_id: str, session_id: str, indexes: Iterable[int]) -> None:
        """Drop archived turns (redacted, or of a cleared session) from recall."""
        doomed = [turn_doc_id(session_id, i) for i in indexes]
        for start in range(0, len(doomed), _PAGE):
            await self.index.remove(user_id, doomed[start : start + _PAGE])

    async def purge_user(self, user_id: str) -> int:
        """GDPR: delete everything of the user in the durable store (memories, change log,
        registered sessions) and the index. Returns what the durable store counted."""
        validate_id(user_id, what="user_id")
        count = await self.durable.purge_user(user_id)
        await self.index.purge_user(user_id)
        return count

    async def aclose(self) -> None:
        """Close the index and the recaller (not the durable store: its owner closes it)."""
        if self.recaller is not None:
            await self.recaller.aclose()
        await self.index.aclose()

    # -- internals ------------------------------------------------------------------------

    def _user_type(self, name: str) -> MemoryType:
        if not isinstance(name, str):
            raise ValidationError(f"memory_type must be a string, got {type(name).__name__}")
        if is_internal_type(name):
            raise ValidationError(
                f"memory type {name!r} is internal to tiermem; use one of "
                f"{', '.join(self.types.names())} or register your own"
            )
        return self.types.get(name)

    async def _scan(
        self,
        user_id: str,
        *,
        memory_types: Collection[str] | None = None,
        include_expired: bool = False,
    ) -> AsyncIterator[Records]:
        """The user's memories newest first, in pages, each record once. Pages by
        ``until`` = the oldest time seen (inclusive, deduplicated), widening a page that
        one instant fills."""
        seen: set[str] = set()
        until: datetime | None = None
        size = self._page
        while True:
            batch = await self.durable.query_memories(
                user_id,
                memory_types=memory_types,
                until=until,
                limit=size,
                include_expired=include_expired,
            )
            fresh = [r for r in batch if r.memory_id not in seen]
            seen.update(r.memory_id for r in fresh)
            if fresh:
                yield fresh
            if len(batch) < size:
                return
            oldest = batch[-1].created_at
            if batch[0].created_at == oldest:
                size *= 2
                continue
            until = oldest + timedelta(microseconds=1)

    async def _sync_index(self, user_id: str, memory_id: str) -> None:
        """Make the index hold the record's current version (or not hold it, if it is gone
        or hidden). Re-reads until the record did not change while being indexed, so the
        last of several concurrent writers leaves the newest version in the index."""
        record = await self.durable.get_memory(user_id, memory_id)
        for _ in range(_CAS_ATTEMPTS):
            if record is None or is_hidden(record, self.clock.now()):
                await self.index.remove(user_id, [memory_id])
            else:
                await self.index.upsert([memory_doc(record)])
            again = await self.durable.get_memory(user_id, memory_id)
            if _stamp(again) == _stamp(record):
                return
            record = again
        logger.warning(
            "index of memory %s of user %s may be stale: it kept changing", memory_id, user_id
        )

    async def _log(
        self,
        user_id: str,
        op: ChangeOp,
        record: MemoryRecord,
        summary: str,
        *,
        related: str | None = None,
    ) -> None:
        await self._log_raw(user_id, op, record.memory_id, record.memory_type, summary, related)

    async def _log_raw(
        self,
        user_id: str,
        op: ChangeOp,
        memory_id: str,
        memory_type: str,
        summary: str,
        related: str | None = None,
    ) -> None:
        now = self.clock.now()
        seq = next(self._seq)
        # Time and a process sequence first, so the store's (created_at, memory_id) order
        # is the order of the changes even when a fake clock stands still.
        entry_id = f"chg-{_us(now):017d}-{seq:09d}-{self.ids.new_id()}"
        metadata: dict[str, JsonValue] = {
            "op": op,
            "memory_id": memory_id,
            "memory_type": memory_type,
            "at": now.isoformat(),
            "summary": summary,
        }
        if related is not None:
            metadata["related"] = related
        await self.durable.put_memory(
            MemoryRecord(
                memory_id=entry_id,
                user_id=user_id,
                memory_type=CHANGE_LOG_TYPE,
                content=summary,
                metadata=metadata,
                importance=0.0,
                created_at=now,
                expires_at=now + CHANGE_LOG_RETENTION,
                provenance=Provenance(source="system"),
            )
        )


def _stamp(record: MemoryRecord | None) -> tuple[int, str, datetime | None]:
    if record is None:
        return (0, "", None)
    return (record.version, record.content, record.invalid_from)


def _entry(record: MemoryRecord) -> ChangeEntry | None:
    meta = record.metadata
    try:
        return ChangeEntry(
            entry_id=record.memory_id,
            op=meta["op"],
            memory_id=meta["memory_id"],
            memory_type=meta["memory_type"],
            at=record.created_at,
            summary=record.content,
            related=meta.get("related"),
        )
    except (KeyError, ValueError):
        logger.warning("skipping malformed change-log entry %s", record.memory_id)
        return None
