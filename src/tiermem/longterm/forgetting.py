"""Forgetting in :class:`~tiermem.longterm.memory.LongTermMemory`: one memory, a session's,
archived turns in the index, or all of a user's (GDPR).

* **Forgetting** deletes from the durable store and the index.
  :meth:`~MemoryForgetting.forget_session` reads the user's whole partition (it is not on
  the recall path; see its docstring).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from tiermem.errors import ConflictError, ValidationError
from tiermem.longterm.endings import is_ending
from tiermem.longterm.memory_core import _PAGE, MemoryCore
from tiermem.longterm.recall import turn_doc_id
from tiermem.longterm.records import (
    Sources,
    is_bookkeeping,
    is_preference_slot,
    plan_forget_session,
    preference_history_id,
    public_type,
)
from tiermem.models import MemoryRecord, Provenance
from tiermem.retry import CAS_ATTEMPTS, pause
from tiermem.store.keys import validate_id

__all__ = ["MemoryForgetting"]


class MemoryForgetting(MemoryCore):
    """Deleting memories (with their history and what derives from them) and index docs."""

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
        if record is not None and is_bookkeeping(record):
            raise ValidationError(
                f"{memory_id!r} is a change-log entry; it goes with purge_user or its retention"
            )
        doomed = [memory_id]
        if record is not None and is_preference_slot(record):
            doomed += [preference_history_id(memory_id, v) for v in range(1, record.version)]
        deleted = await asyncio.gather(*(self.durable.delete_memory(user_id, i) for i in doomed))
        await self.index.remove(user_id, doomed)
        if deleted[0]:
            kind = public_type(record.memory_type) if record is not None else "unknown"
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
          the session are deleted. A deleted preference that had superseded a record of an
          old name of its key (:data:`~tiermem.longterm.preferences.PREFERENCE_KEY_ALIASES`:
          ``favorite_language`` by ``preferred_language``) leaves that record current
          again, as a rollback would, unless it is forgotten too.

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
        deleted_slots = {
            i for i in plan.forgotten - plan.rollbacks.keys() if is_preference_slot(records[i])
        }
        for record in records.values():
            if (
                record.metadata.get("superseded_by") in deleted_slots
                and record.memory_id not in plan.forgotten
                and is_preference_slot(record)
            ):
                await self._restore_old_key(record)
        summary = f"forgotten with session {session_id}"
        await asyncio.gather(
            *(
                self._log_raw(user_id, "forget", i, public_type(records[i].memory_type), summary)
                for i in sorted(plan.forgotten)
            )
        )
        return len(plan.forgotten)

    async def _roll_back(self, slot: MemoryRecord, history: MemoryRecord, session_id: str) -> bool:
        """Make ``history``'s value the slot's current one again. False if the slot got a
        value from elsewhere meanwhile (that value stands). The slot is this session's
        value, or an ending of a value only this session stated (``plan_forget_session``),
        which another session or ``retire_preference`` wrote: that ending, unchanged."""
        current: MemoryRecord | None = slot
        for attempt in range(CAS_ATTEMPTS):
            if current is None:
                return False
            if current.provenance.session_id != session_id and (
                not is_ending(slot.metadata)
                or (current.content, current.metadata) != (slot.content, slot.metadata)
            ):
                return False
            restored = history.model_copy(
                update={
                    "memory_id": slot.memory_id,
                    "memory_type": slot.memory_type,
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

    async def _restore_old_key(self, record: MemoryRecord) -> None:
        """Make a record of an old key name, superseded by a slot now deleted, current
        again (its value is the preference's newest that was not forgotten)."""
        current: MemoryRecord | None = record
        for attempt in range(CAS_ATTEMPTS):
            if current is None or current.invalid_from is None:
                return  # gone, or restored by a concurrent call
            restored = current.model_copy(
                update={
                    "invalid_from": None,
                    "valid_from": self.clock.now(),
                    "version": current.version + 1,
                    "metadata": {k: v for k, v in current.metadata.items() if k != "superseded_by"},
                }
            )
            try:
                await self.durable.put_memory(restored, expected_version=current.version)
            except ConflictError:
                await pause(attempt)
                current = await self.durable.get_memory(record.user_id, record.memory_id)
                continue
            await self._sync_index(record.user_id, record.memory_id)
            return
        raise ConflictError(f"preference {record.memory_id!r} kept changing; try again")

    async def _replace_sources(self, user_id: str, memory_id: str, sources: Sources) -> None:
        """Make ``sources[0]`` the record's provenance and the rest its ``also_from``."""
        primary = Provenance.model_validate({k: v for k, v in sources[0].items() if k != "at"})
        for attempt in range(CAS_ATTEMPTS):
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
