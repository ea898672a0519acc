"""The base of :class:`~tiermem.longterm.memory.LongTermMemory`: its state (``__init__``) and
the internals every operation shares (type checks, paged scans, index sync, change log).

* **Change log.** Every write appends one entry (a record of the internal type
  ``CHANGE_LOG_TYPE`` = ``_change``, kept 365 days): op, memory id and type, time,
  summary. Entries never hold memory content, so forgetting a memory leaves no copy of it
  behind in the log.
* **The search index follows the durable store.** After each write the record is read
  back and indexed (or removed from the index if it is hidden), and read again until it
  did not change meanwhile: concurrent writers always leave the index at the newest
  version. Internal records and superseded ones are never indexed.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Collection
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from tiermem.clock import Clock, IdFactory
from tiermem.errors import ValidationError
from tiermem.llm.embeddings import Embedder
from tiermem.longterm.hits import RecallHit
from tiermem.longterm.index import DocKind, SearchIndex
from tiermem.longterm.recall import memory_doc
from tiermem.longterm.records import (
    CHANGE_LOG_RETENTION,
    CHANGE_LOG_TYPE,
    ChangeEntry,
    ChangeOp,
    is_hidden,
)
from tiermem.longterm.types import MemoryType, MemoryTypeRegistry, is_internal_type
from tiermem.models import JsonValue, MemoryRecord, Provenance
from tiermem.retry import CAS_ATTEMPTS
from tiermem.store.contract import DurableStore
from tiermem.tokens import TiktokenCounter, TokenCounter

if TYPE_CHECKING:
    from tiermem.tokens import ModelRegistry

__all__ = ["MemoryCore", "MemoryRecaller", "Records"]

# The name it had before LongTermMemory was split into modules, so log configuration holds.
logger = logging.getLogger("tiermem.longterm.memory")

_PAGE = 500
_MEMORY_SCOPE: tuple[DocKind, ...] = ("memory",)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
Records = list[MemoryRecord]  # the class has a method named ``list``


def _us(value: datetime) -> int:
    return (value - _EPOCH) // timedelta(microseconds=1)


class MemoryRecaller(Protocol):
    """What :meth:`~tiermem.longterm.memory.LongTermMemory.recall` delegates to
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


class MemoryCore:
    """State and shared internals of :class:`~tiermem.longterm.memory.LongTermMemory`; the
    operations are in the mixins it is composed of."""

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
        for _ in range(CAS_ATTEMPTS):
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
