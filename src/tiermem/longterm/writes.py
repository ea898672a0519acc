"""Writing memories: :meth:`~MemoryWrites.remember`, :meth:`~MemoryWrites.supersede` and
:meth:`~MemoryWrites.remember_detected` of :class:`~tiermem.longterm.memory.LongTermMemory`.

* **Dedup.** :meth:`~MemoryWrites.remember` gives a record an id computed from its type
  and its normalised content (NFKC, case-folded, whitespace collapsed, trailing
  punctuation dropped: ``dedup_memory_id``) and writes it only if absent
  (``put_memory(expected_version=0)``). Remembering the same fact again, even from two
  tasks at once, yields one record: the repeat merges into it (new tags added, importance
  raised, retention extended, and its provenance appended to ``metadata["also_from"]``, at
  most ``MAX_ALSO_FROM`` entries, so where else it was said is not lost).
* **Supersession** hides a record (``invalid_from`` = now, ``metadata["superseded_by"]``)
  and adds its successor (``provenance.memory_ids`` and ``metadata["supersedes"]`` point
  back). Nothing is deleted: ``list(include_superseded=True)`` shows the history.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from tiermem.errors import ConflictError, NotFoundError, ValidationError
from tiermem.longterm.detect import DISLIKES, DetectedMemory
from tiermem.longterm.endings import dislike_ending
from tiermem.longterm.memory_core import MemoryCore, Records
from tiermem.longterm.records import (
    MAX_CONTENT_BYTES,
    check_importance,
    check_metadata,
    check_provenance,
    check_tags,
    check_text,
    check_time,
    dedup_memory_id,
    merge_repeat,
)
from tiermem.longterm.types import MemoryType, is_internal_type
from tiermem.models import JsonValue, MemoryRecord, Provenance
from tiermem.retry import CAS_ATTEMPTS, pause
from tiermem.store.keys import validate_id

__all__ = ["MemoryWrites"]


class MemoryWrites(MemoryCore):
    """Remembering (deduplicated), superseding, and writing detected memories."""

    if TYPE_CHECKING:
        # In :class:`~tiermem.longterm.preferences.MemoryPreferences`.
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
        ) -> MemoryRecord: ...

        async def _retire_preference(
            self,
            user_id: str,
            key: str,
            matches: Callable[[str], bool],
            *,
            provenance: Provenance,
            retired_by: MemoryRecord | None = None,
            reason: str | None = None,
        ) -> MemoryRecord | None: ...

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
        expires_at: datetime | None = None,
    ) -> MemoryRecord:
        """Remember ``content``; the same content (normalised) of the same type is one record.

        ``importance`` defaults to the type's, ``provenance`` to
        ``Provenance(source="explicit")``. Retention (``expires_at``) is the type's,
        counted from now, unless ``expires_at`` is given: then the record expires then,
        earlier or later than the type's (a caller that knows when the memory stops being
        true, e.g. an observed habit 30 days after its last session). A repeat returns the
        existing record, merged (see the module docstring): said again without
        ``expires_at``, its retention starts again (never shortened); with it, it expires
        at the time given. A superseded record said again is revived.

        Raises:
            ValidationError: a bad id, empty or oversized content, an unknown or internal
                type, bad tags, importance, metadata or provenance; ``expires_at`` naive
                or not after now.
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
            expires_at=self._check_expiry(expires_at),
        )
        stored, what = await self._create_or_merge(
            candidate,
            importance_given=importance is not None,
            expiry_given=expires_at is not None,
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
        expires_at: datetime | None = None,
    ) -> MemoryRecord:
        """``expires_at``: checked by :meth:`_check_expiry` (None: the type's retention)."""
        now = self.clock.now()
        if expires_at is None and kind.retention is not None:
            expires_at = now + kind.retention
        return MemoryRecord(
            memory_id=memory_id,
            user_id=user_id,
            memory_type=kind.name,
            content=content,
            tags=tags,
            metadata=metadata,
            importance=importance,
            created_at=now,
            expires_at=expires_at,
            provenance=provenance,
            valid_from=valid_from or now,
        )

    def _check_expiry(self, expires_at: datetime | None) -> datetime | None:
        """A caller's ``expires_at``: aware and after now (a memory given an expiry that
        has passed would be written only to be hidden)."""
        expires_at = check_time(expires_at, what="expires_at")
        if expires_at is not None and expires_at <= self.clock.now():
            raise ValidationError(
                f"expires_at {expires_at.isoformat()} is not after now "
                f"({self.clock.now().isoformat()}); give a time in the future, or no "
                "expires_at for the type's retention"
            )
        return expires_at

    async def _create_or_merge(
        self, candidate: MemoryRecord, *, importance_given: bool, expiry_given: bool = False
    ) -> tuple[MemoryRecord, str]:
        """Write ``candidate`` if its id is free, else merge it into the record there.
        Returns the stored record and what was done ("" if nothing was written)."""
        user_id, memory_id = candidate.user_id, candidate.memory_id
        for attempt in range(CAS_ATTEMPTS):
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
                existing,
                candidate,
                importance_given=importance_given,
                now=self.clock.now(),
                expiry_given=expiry_given,
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
            f"memory {memory_id!r} of user {user_id!r} kept changing under {CAS_ATTEMPTS} "
            "attempts; try again"
        )

    async def _embedded(self, record: MemoryRecord) -> MemoryRecord:
        if self.embedder is None:
            return record
        (vector,) = await self.embedder.embed([record.content])
        return record.model_copy(
            update={"embedding": tuple(vector), "embedding_model": self.embedder.model_id}
        )

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
        expires_at: datetime | None = None,
    ) -> MemoryRecord:
        """Replace a memory by a new one; the old one stays in history, hidden from recall.

        The old record gets ``invalid_from`` = now and ``metadata["superseded_by"]``; the new
        one (type, tags and importance default to the old one's) has the old id in
        ``provenance.memory_ids`` and ``metadata["supersedes"]``. The old record is marked
        first, then the new one written: a retry after a crash in between finishes the job.
        The new one's retention is its type's from now, or ``expires_at`` as in
        :meth:`remember`.

        Raises:
            NotFoundError: no such memory (or it expired).
            ValidationError: bad input; the memory is a preference (use
                :meth:`upsert_preference`) or internal; the new content is the old content;
                ``expires_at`` naive or not after now.
            ConflictError: the memory was already superseded by something else.
        """
        validate_id(user_id, what="user_id")
        validate_id(memory_id, what="memory_id")
        text = check_text(new_content, what="new_content", limit=MAX_CONTENT_BYTES)
        expiry = self._check_expiry(expires_at)
        extra = check_metadata(metadata)
        prov = check_provenance(provenance, "explicit")
        new_tags = None if tags is None else check_tags(tags)
        for attempt in range(CAS_ATTEMPTS):
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
            expires_at=expiry,
        )
        stored, _ = await self._create_or_merge(
            candidate, importance_given=importance is not None, expiry_given=expiry is not None
        )
        await asyncio.gather(
            self._sync_index(user_id, memory_id), self._sync_index(user_id, stored.memory_id)
        )
        await self._log(
            user_id, "supersede", old, f"superseded by {stored.memory_id}", related=stored.memory_id
        )
        return stored

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
                if draft.value in DISLIKES:
                    await self._retire_disliked_favourite(user_id, draft.key, record, source)
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

    async def _retire_disliked_favourite(
        self, user_id: str, opinion_key: str, dislike: MemoryRecord, provenance: Provenance
    ) -> None:
        """After a dislike of a value (``opinion:genre:horror`` = ``dislikes``), end the
        favourite of its kind (``favorite_genre``) if that is the same value
        (:func:`~tiermem.longterm.endings.dislike_ending`): "I prefer horror", later "I
        don't like horror anymore", leaves no favourite genre, rather than a favourite and
        a dislike of one thing. The reverse, a dislike and then "I love horror now", is one
        opinion key rewritten."""
        found = dislike_ending(opinion_key)
        if found is None:
            return
        favourite_key, matches = found
        await self._retire_preference(
            user_id, favourite_key, matches, provenance=provenance, retired_by=dislike
        )
