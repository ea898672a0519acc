"""Preferences of :class:`~tiermem.longterm.memory.LongTermMemory`: one current value per
``(user, key)``, and its history.

* **Preferences are slots.** The current value for ``(user, key)`` lives at
  ``preference_slot_id(key)`` and is replaced by compare-and-set (read version v, write
  v + 1). Before the write, the value being replaced is copied to a history record at
  ``preference_history_id`` (``<slot>-v<v>``, ``invalid_from`` = now). The id is
  deterministic, so two writers racing on one version write one history record; the race
  seed 000's read-then-write ``store_preference`` lost is a retry here.
* **History is stored apart.** History records have the internal type
  ``PREFERENCE_HISTORY_TYPE`` (shown to users as ``preference``), so reading the current
  preferences, a query by type, never reads a key's history, however often it changed.
  They keep the slot's ``created_at`` and ``expires_at`` (they are copies).
* **Renamed keys.** :data:`PREFERENCE_KEY_ALIASES` maps a key that auto-detection wrote
  before it was unified to the key that holds its meaning now (``favorite_language`` →
  ``preferred_language``, session 15: "my favorite language is Japanese" and "I prefer
  Japanese" are one preference). Nothing is rewritten in bulk: an old record stays current,
  under its old key, until the preference is set again; then the new key's write
  supersedes it (``invalid_from`` = now, so the preferences view, recall and the user
  context stop showing it) and :meth:`MemoryPreferences.preference_history` of the new
  key lists it after the new key's own history. Reading or setting the old key reads or
  sets the new one; reading the new key falls back to a current old record.
* **A slot can be retired.** A detected dislike of the favourite's value ends it
  (:mod:`tiermem.longterm.endings`), and so does the application
  (:meth:`MemoryPreferences.retire_preference`: "forget that I like horror"): the slot's
  newest version is no longer valid, so the key has no current value, and its history keeps
  why and the value ended.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from tiermem.errors import ConflictError, NotFoundError
from tiermem.longterm.endings import ENDED_BY_KEY, ENDED_REASON
from tiermem.longterm.memory_core import MemoryCore, Records
from tiermem.longterm.records import (
    MAX_CONTENT_BYTES,
    MAX_KEY_CHARS,
    MAX_VALUE_BYTES,
    PREFERENCE_HISTORY_TYPE,
    check_importance,
    check_limit,
    check_metadata,
    check_provenance,
    check_tags,
    check_text,
    normalize_preference_key,
    preference_history_id,
    preference_slot_id,
    public_record,
)
from tiermem.models import JsonValue, MemoryRecord, Provenance
from tiermem.retry import CAS_ATTEMPTS, pause
from tiermem.store.contract import MAX_MEMORY_IDS_PER_GET
from tiermem.store.keys import validate_id

__all__ = ["PREFERENCE_KEY_ALIASES", "MemoryPreferences"]

PREFERENCE_KEY_ALIASES: Mapping[str, str] = {"favorite_language": "preferred_language"}
"""Old preference key → the key that holds its meaning now (see the module docstring)."""
_OLD_KEYS = {
    new: tuple(old for old, key in PREFERENCE_KEY_ALIASES.items() if key == new)
    for new in PREFERENCE_KEY_ALIASES.values()
}
"""Key → the old keys whose meaning it holds now."""


def _current_key(key: str) -> str:
    """``key`` (normalised) as it is written now."""
    return PREFERENCE_KEY_ALIASES.get(key, key)


class MemoryPreferences(MemoryCore):
    """Setting a preference atomically, reading it and its history."""

    if TYPE_CHECKING:
        # In :class:`~tiermem.longterm.memory.LongTermMemory`.
        async def list(
            self,
            user_id: str,
            *,
            types: Collection[str] | None = None,
            include_superseded: bool = False,
            limit: int = 100,
        ) -> Records: ...

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
        norm_key = _current_key(normalize_preference_key(raw_key))
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
        for attempt in range(CAS_ATTEMPTS):
            current = await self.durable.get_memory(user_id, slot_id)
            if (
                current is not None
                and current.invalid_from is None  # a retired favourite said again is revived
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
            for old_key in _OLD_KEYS.get(norm_key, ()):
                await self._supersede_old_key(user_id, old_key, stored)
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
            f"{CAS_ATTEMPTS} attempts; try again"
        )

    async def retire_preference(
        self,
        user_id: str,
        key: str,
        *,
        reason: str,
        provenance: Provenance | None = None,
    ) -> MemoryRecord:
        """End the user's preference ``key``: it has no current value afterwards ("forget
        that I like horror"), as when a detected dislike ends a favourite.

        The slot gets a version that is no longer valid, whose content says what ended and
        ``reason`` ("no longer favorite_genre: horror (the user asked to forget it)"),
        with ``metadata["retired_reason"]`` = ``reason`` and ``provenance`` (default
        ``Provenance(source="explicit")``); the value goes to history as an upsert's would.
        So :meth:`get_preference` returns None (``include_retired=True``: the ended record),
        the preferences view, recall and the user context stop showing it, and
        :meth:`preference_history` lists the ending, then the value. Undone the way a
        detected ending is: :meth:`upsert_preference` of any value sets it again, and
        :meth:`forget_session` of ``provenance.session_id`` rolls the slot back to the
        value. Returns the retired slot.

        Raises:
            ValidationError: a bad user id, an empty or oversized key or reason (at most
                4 KiB), bad provenance.
            NotFoundError: the user never had the preference, or it has no current value
                (already ended).
            ConflictError: the key kept changing under 32 attempts.
        """
        validate_id(user_id, what="user_id")
        norm_key = _current_key(
            normalize_preference_key(check_text(key, what="preference key", limit=MAX_KEY_CHARS))
        )
        validate_id(norm_key, what="preference key")
        why = check_text(reason, what="retirement reason", limit=MAX_VALUE_BYTES)
        prov = check_provenance(provenance, "explicit")
        retired = await self._retire_preference(
            user_id, norm_key, lambda _: True, provenance=prov, reason=why
        )
        if retired is not None:
            return retired
        slot = await self.get_preference(user_id, norm_key, include_retired=True)
        if slot is None:
            raise NotFoundError(
                f"user {user_id!r} has no preference {norm_key!r}; nothing to retire (set it "
                "with upsert_preference)"
            )
        raise NotFoundError(
            f"preference {norm_key!r} of user {user_id!r} has no current value (it was "
            "already ended); nothing to retire"
        )

    async def _retire_preference(
        self,
        user_id: str,
        key: str,
        matches: Callable[[str], bool],
        *,
        provenance: Provenance,
        retired_by: MemoryRecord | None = None,
        reason: str | None = None,
    ) -> MemoryRecord | None:
        """End preference ``key`` (normalised, as written now) if ``matches`` its current
        value, because of ``retired_by`` (the dislike of that value: see
        :mod:`tiermem.longterm.endings`) or ``reason`` (an explicit ending). Returns the
        retired slot, or None if the current value is another (or there is none).

        The slot gets a new version that is no longer valid (``invalid_from`` =
        ``valid_from`` = now), with ``provenance`` (the turn that ended it), a content that
        says so, and in metadata why (``retired_reason``: ``reason``, else the dislike's
        content) and, for a dislike, ``retired_by`` (its id) and ``retired_by_key`` (its
        opinion key); the value it had goes to history as an upsert's would. So the
        preferences view, recall, the user context and :meth:`get_preference` show no
        value, :meth:`preference_history` shows the retirement and then the value,
        :meth:`upsert_preference` of any value (the same one again too) sets it again, and
        forgetting the session of ``provenance`` rolls the slot back to the value (the
        retirement came from that session). A current record of an old name of the key is
        superseded by the retired slot, as by an upsert.

        Raises:
            ConflictError: the key kept changing under 32 attempts.
        """
        why = reason if reason is not None else retired_by.content if retired_by else ""
        ending: dict[str, JsonValue] = {"preference_key": key, ENDED_REASON: why}
        if retired_by is not None:
            ending["retired_by"] = retired_by.memory_id
            dislike_key = retired_by.metadata.get("preference_key")
            if isinstance(dislike_key, str):
                ending[ENDED_BY_KEY] = dislike_key
        slot_id = preference_slot_id(key)
        for attempt in range(CAS_ATTEMPTS):
            current = await self.durable.get_memory(user_id, slot_id)
            shown = current if current is not None else await self._current_old_record(user_id, key)
            if shown is None or shown.invalid_from is not None:
                return None
            said = shown.metadata.get("preference_value")
            if not isinstance(said, str) or not matches(said):
                return None
            now = self.clock.now()
            retired = shown.model_copy(
                update={
                    "memory_id": slot_id,
                    "content": f"no longer {key}: {said} ({why})",
                    "metadata": {**ending, "preference_value": said},
                    "created_at": now,
                    "valid_from": now,
                    "invalid_from": now,
                    "provenance": provenance,
                    "tags": (),
                    "version": current.version + 1 if current is not None else 1,
                    "embedding": None,
                    "embedding_model": None,
                }
            )
            if current is not None:
                await self._write_history(current, now)
            try:
                stored = await self.durable.put_memory(
                    retired, expected_version=current.version if current is not None else 0
                )
            except ConflictError:
                await pause(attempt)
                continue
            await self._sync_index(user_id, slot_id)
            for old_key in _OLD_KEYS.get(key, ()):
                await self._supersede_old_key(user_id, old_key, stored)
            await self._log(
                user_id,
                "supersede",
                stored,
                f"preference {key!r} retired by {retired_by.memory_id}: {why}"
                if retired_by is not None
                else f"preference {key!r} retired: {why}",
                related=retired_by.memory_id if retired_by is not None else None,
            )
            return stored
        raise ConflictError(
            f"preference {key!r} of user {user_id!r} kept changing under "
            f"{CAS_ATTEMPTS} attempts; try again"
        )

    async def _supersede_old_key(self, user_id: str, old_key: str, new: MemoryRecord) -> None:
        """Mark the current record of ``old_key`` (a renamed key) superseded by ``new``,
        the record of the key that replaced it; nothing if there is none or it already is.
        """
        old_id = preference_slot_id(old_key)
        for attempt in range(CAS_ATTEMPTS):
            old = await self.durable.get_memory(user_id, old_id)
            if old is None or old.invalid_from is not None:
                return
            retired = old.model_copy(
                update={
                    "invalid_from": new.valid_from,
                    "version": old.version + 1,
                    "metadata": {**old.metadata, "superseded_by": new.memory_id},
                }
            )
            try:
                await self.durable.put_memory(retired, expected_version=old.version)
            except ConflictError:
                await pause(attempt)
                continue
            await self._sync_index(user_id, old_id)
            await self._log(
                user_id, "supersede", retired, f"renamed key {old_key!r} superseded by a new value"
            )
            return
        raise ConflictError(
            f"preference {old_key!r} of user {user_id!r} kept changing under "
            f"{CAS_ATTEMPTS} attempts; try again"
        )

    async def _write_history(self, current: MemoryRecord, now: datetime) -> None:
        """Copy the slot's value at ``current.version`` to its history record. Idempotent:
        every writer that read this version writes the same record."""
        history = current.model_copy(
            update={
                "memory_id": preference_history_id(current.memory_id, current.version),
                "memory_type": PREFERENCE_HISTORY_TYPE,
                "version": 1,
                "invalid_from": current.invalid_from or now,  # a retirement keeps its time
                "metadata": {
                    **current.metadata,
                    "history_of": current.memory_id,
                    "slot_version": current.version,
                },
            }
        )
        for _ in range(CAS_ATTEMPTS):
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

    async def get_preference(
        self, user_id: str, key: str, *, include_retired: bool = False
    ) -> MemoryRecord | None:
        """The current record of preference ``key``, or None. A renamed key reads the key
        that replaced it; that key, while it was never set, reads a current record of its
        old name (:data:`PREFERENCE_KEY_ALIASES`).

        A favourite ended by a dislike of its value (see :meth:`_retire_preference`) has
        no current record: None, or with ``include_retired`` the retired record
        (``invalid_from`` set, ``metadata["retired_by"]``), for a writer that must know a
        value was ended, and when and where, before writing one."""
        validate_id(user_id, what="user_id")
        norm_key = _current_key(
            normalize_preference_key(check_text(key, what="preference key", limit=MAX_KEY_CHARS))
        )
        found = await self.durable.get_memory(user_id, preference_slot_id(norm_key))
        if found is not None:
            return found if found.invalid_from is None or include_retired else None
        return await self._current_old_record(user_id, norm_key)

    async def _current_old_record(self, user_id: str, norm_key: str) -> MemoryRecord | None:
        """A current record of one of ``norm_key``'s old names, or None."""
        for old_key in _OLD_KEYS.get(norm_key, ()):
            old = await self.durable.get_memory(user_id, preference_slot_id(old_key))
            if old is not None and old.invalid_from is None:
                return old
        return None

    async def preference_history(self, user_id: str, key: str, *, limit: int = 100) -> Records:
        """The earlier values of preference ``key``, newest first (not the current one).

        Reads history records by their ids, in batched reads of at most
        ``MAX_MEMORY_IDS_PER_GET`` (no query over the partition, no read per record);
        values that expired, or were forgotten with their session, are left out.
        """
        validate_id(user_id, what="user_id")
        norm_key = _current_key(
            normalize_preference_key(check_text(key, what="preference key", limit=MAX_KEY_CHARS))
        )
        check_limit(limit)
        current = await self.durable.get_memory(user_id, preference_slot_id(norm_key))
        if current is None:
            current = await self._current_old_record(user_id, norm_key)
        if current is None:
            return []
        # A retired slot (see _retire_preference) has no current value: its own record,
        # which says what ended the value and when, is the newest entry.
        retired = [current.memory_id] if current.invalid_from is not None else []
        versions = range(current.version - 1, max(0, current.version - 1 - limit), -1)
        ids = [*retired, *(preference_history_id(current.memory_id, v) for v in versions)]
        ids = ids[:limit]
        # The superseded record of a renamed key, after the key's own history (it is older).
        old_ids = {preference_slot_id(old_key) for old_key in _OLD_KEYS.get(norm_key, ())} - {
            current.memory_id
        }
        ids += sorted(old_ids)[: limit - len(ids)]
        found: dict[str, MemoryRecord] = {}
        for start in range(0, len(ids), MAX_MEMORY_IDS_PER_GET):
            found |= await self.durable.get_memories(
                user_id, ids[start : start + MAX_MEMORY_IDS_PER_GET]
            )
        return [
            public_record(found[i])
            for i in ids
            if i in found
            and (i not in old_ids or found[i].invalid_from is not None)
            and (i not in retired or found[i].invalid_from is not None)
        ]

    async def preferences(self, user_id: str, *, limit: int = 100) -> Records:
        """The user's current preferences (slots and plainly remembered ones), newest first."""
        return await self.list(user_id, types=["preference"], limit=limit)
